//! The canonical workloads (W1 to W5 of the brief) and the run that drives them: create the
//! topics and subscriptions, start publisher and subscriber threads together, print progress
//! once a second, then check every delivery against the acknowledged publishes.
//!
//! | workload | topics | subscriptions | subscribers |
//! |---|---|---|---|
//! | publish (W1) | 1 | 0 | none |
//! | e2e (W2) | 1 | 1 | concurrently with the publishers |
//! | fanout (W3) | 1 | N, each receives every message | concurrently |
//! | topics (W4) | N | 1 per topic; publishes spread evenly | concurrently, multiplexed streams |
//! | backlog (W5) | 1 | 1 | only once every message is stored: the drain |
//! | push | 1 | 1, pushed by the daemon | an HTTP receiver in this process, answering 204 |

use super::embedded::unique_suffix;
use super::gate::StartGate;
use super::ids::IdSet;
use super::latency::{self, new_histogram};
use super::live::{report_progress, LiveStats, Progress, Watched};
use super::publish::{
    payload_template, publisher_run, PublishOptions, PublisherContext, PublisherOutcome, STAMP_BYTES,
};
use super::receiver::{receiver_run, PushReceiver, ReceiverContext};
use super::report::{DeliveryReport, Report, Resident, ShardLatency};
use super::setup::{self, Admin};
use super::subscribe::{
    subscriber_run, SubscriberContext, SubscriberOutcome, Target, WINDOW_DEFAULT, WINDOW_MAX,
};
use super::Failure;
use ringpost_client::{block_on, ErrorCode, PushConfig, StatsResponse, Subscription};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::ScopedJoinHandle;
use std::time::Instant;

pub const SUBSCRIPTIONS_DEFAULT: usize = 10;
pub const SUBSCRIPTIONS_MAX: usize = 1000;
pub const TOPICS_DEFAULT: usize = 10_000;
/// Each topic is a log with its own pre-written segment files (1 MiB to start with), so this
/// many topics already take 100 GB of disk.
pub const TOPICS_MAX: usize = 100_000;
pub const SUBSCRIBER_THREADS_MAX: usize = 64;
/// Fan-out subscriptions share this many threads by default: on a small machine ten threads
/// would only take turns on the same cores.
pub const FANOUT_SUBSCRIBER_THREADS_DEFAULT: usize = 4;
/// The topics workload's streams are multiplexed over this many threads by default.
pub const TOPICS_SUBSCRIBER_THREADS_DEFAULT: usize = 2;
/// The address the push workload's receiver listens on, which the daemon must reach.
pub const RECEIVER_HOST_DEFAULT: &str = "127.0.0.1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Publish,
    EndToEnd,
    Fanout,
    Topics,
    Backlog,
    /// W2's publishing, with the subscription pushed to a receiver in this process.
    Push,
}

impl Workload {
    /// The name on the command line and in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Publish => "publish",
            Workload::EndToEnd => "e2e",
            Workload::Fanout => "fanout",
            Workload::Topics => "topics",
            Workload::Backlog => "backlog",
            Workload::Push => "push",
        }
    }

    pub fn has_subscribers(self) -> bool {
        self != Workload::Publish
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadOptions {
    pub workload: Workload,
    pub publish: PublishOptions,
    /// Topics of the topics and publish workloads (the others have one; publish's default is
    /// one), publishes taking turns over them.
    pub topics: usize,
    /// Publish sources of each topic made for the run (`--sources`; 1: a topic of one source).
    pub sources: u32,
    /// Subscriptions of the fan-out workload (e2e and backlog have one, topics one per topic).
    pub subscriptions: usize,
    /// Flow-control window of each stream, in messages.
    pub window: u64,
    pub subscriber_threads: usize,
    /// Delete the topics and subscriptions made for the run when it ends. A scratch daemon is
    /// removed whole, so there this only costs time.
    pub cleanup: bool,
    /// Seconds to leave the new topics idle before reading the daemon's resident memory with
    /// them, so that what the creation burst freed is given back first (a forwarder trims
    /// malloc's free memory about 12 s after its last request).
    pub settle_seconds: u64,
    /// Push workload: where its receiver listens (the daemon pushes there).
    pub receiver_host: String,
}

impl WorkloadOptions {
    /// The defaults of `workload`.
    pub fn new(workload: Workload, publish: PublishOptions) -> WorkloadOptions {
        WorkloadOptions {
            workload,
            publish,
            topics: if workload == Workload::Topics { TOPICS_DEFAULT } else { 1 },
            sources: 1,
            subscriptions: SUBSCRIPTIONS_DEFAULT,
            window: WINDOW_DEFAULT,
            subscriber_threads: match workload {
                Workload::Publish => 0,
                Workload::EndToEnd | Workload::Backlog | Workload::Push => 1,
                Workload::Fanout => FANOUT_SUBSCRIBER_THREADS_DEFAULT.min(SUBSCRIPTIONS_DEFAULT),
                Workload::Topics => TOPICS_SUBSCRIBER_THREADS_DEFAULT,
            },
            cleanup: true,
            settle_seconds: 0,
            receiver_host: RECEIVER_HOST_DEFAULT.to_owned(),
        }
    }

    pub fn topic_count(&self) -> usize {
        match self.workload {
            Workload::Topics | Workload::Publish => self.topics,
            _ => 1,
        }
    }

    pub fn subscription_count(&self) -> usize {
        match self.workload {
            Workload::Publish => 0,
            Workload::EndToEnd | Workload::Backlog | Workload::Push => 1,
            Workload::Fanout => self.subscriptions,
            Workload::Topics => self.topics,
        }
    }

    pub fn validate(&self) -> Result<(), Failure> {
        self.publish.validate()?;
        let usage = |text: String| Err(Failure::usage(format!("InvalidArgument: {text}")));
        if !(1..=TOPICS_MAX).contains(&self.topics) {
            return usage(format!("--topics is {}; it must be 1 to {TOPICS_MAX}", self.topics));
        }
        if self.sources == 0 {
            return usage("--sources is 0; a topic has at least one".to_owned());
        }
        if !self.workload.has_subscribers() {
            return Ok(());
        }
        if self.publish.topic.is_some() {
            return usage(format!("--topic applies to publish only; {} makes its own", self.workload.name()));
        }
        if self.publish.size_bytes < STAMP_BYTES {
            return usage(format!(
                "--size is {}; subscribers need at least {STAMP_BYTES} bytes for the publish time",
                self.publish.size_bytes
            ));
        }
        if !(1..=WINDOW_MAX).contains(&self.window) {
            return usage(format!("--window is {}; it must be 1 to {WINDOW_MAX}", self.window));
        }
        if !(1..=SUBSCRIPTIONS_MAX).contains(&self.subscriptions) {
            return usage(format!(
                "--subscriptions is {}; it must be 1 to {SUBSCRIPTIONS_MAX}",
                self.subscriptions
            ));
        }
        if !(1..=SUBSCRIBER_THREADS_MAX).contains(&self.subscriber_threads) {
            return usage(format!(
                "--subscriber-threads is {}; it must be 1 to {SUBSCRIBER_THREADS_MAX}",
                self.subscriber_threads
            ));
        }
        Ok(())
    }
}

/// The topics and subscriptions of one run.
struct Layout {
    topics: Vec<String>,
    targets: Vec<Target>,
    /// Made for this run, so deleted after it.
    created: bool,
    /// Publish sources of each topic made.
    sources: u32,
}

fn layout(options: &WorkloadOptions) -> Layout {
    let base = format!("bench-{}", unique_suffix());
    let topic_count = options.topic_count();
    let topics: Vec<String> = match (&options.publish.topic, topic_count) {
        (Some(name), _) => vec![name.clone()],
        (None, 1) => vec![base.clone()],
        (None, count) => (0..count).map(|index| format!("{base}-t{index:05}")).collect(),
    };
    let subscription_count = options.subscription_count();
    let targets = (0..subscription_count)
        .map(|index| Target {
            name: format!("{base}-s{index:05}"),
            topic: if options.workload == Workload::Topics { index } else { 0 },
            forwarder: None,
        })
        .collect();
    Layout { topics, targets, created: options.publish.topic.is_none(), sources: options.sources }
}

/// Logs where each of a few topics' sources is led (`node/shard`, source 0 first), so that a
/// run over several topics or sources shows whether they landed on different shards.
fn log_leaders(server: &str, topics: &[String], log: &mut dyn FnMut(&str)) {
    let Ok(client) = block_on(super::connect(server)) else { return };
    for topic in topics {
        if let Ok(shown) = block_on(client.get_topic_with_sources(topic)) {
            let leaders: Vec<String> = shown
                .sources
                .iter()
                .map(|source| format!("{}/{}", source.leader_node, source.leader_shard))
                .collect();
            log(&format!("topic {topic}: sources led on {}", leaders.join(", ")));
        }
    }
}

/// Creates the run's topics, then its subscriptions, in parallel: pushed to `push_endpoint`
/// when one is given.
fn create(server: &str, layout: &Layout, push_endpoint: Option<&str>) -> Result<(), Failure> {
    let topics: Vec<Admin> =
        layout.topics.iter().map(|name| Admin::CreateTopic(name.clone(), layout.sources)).collect();
    setup::apply_all(server, &topics)?;
    let subscriptions: Vec<Admin> = layout
        .targets
        .iter()
        .map(|target| {
            let subscription = Subscription {
                name: target.name.clone(),
                topic: layout.topics[target.topic].clone(),
                ..Subscription::default()
            };
            match push_endpoint {
                None => Admin::CreateSubscription(subscription),
                Some(endpoint) => Admin::CreatePushSubscription(
                    subscription,
                    PushConfig { endpoint: endpoint.to_owned(), ..PushConfig::default() },
                ),
            }
        })
        .collect();
    setup::apply_all(server, &subscriptions)
}

/// Deletes what `create` made; a failure is a warning, since the figures stand.
fn delete(server: &str, layout: &Layout) -> Result<(), Failure> {
    let subscriptions: Vec<Admin> =
        layout.targets.iter().map(|target| Admin::DeleteSubscription(target.name.clone())).collect();
    setup::apply_all(server, &subscriptions)?;
    let topics: Vec<Admin> = layout.topics.iter().map(|name| Admin::DeleteTopic(name.clone())).collect();
    setup::apply_all(server, &topics)
}

/// Counts a thread out when it ends, also by a panic, so the reporter and the subscribers
/// waiting for the publishers are never left waiting for it.
struct CountedOut<'a> {
    counters: [Option<&'a AtomicUsize>; 2],
    reporter: std::thread::Thread,
}

impl Drop for CountedOut<'_> {
    fn drop(&mut self) {
        for counter in self.counters.iter().flatten() {
            counter.fetch_sub(1, Ordering::AcqRel);
        }
        self.reporter.unpark();
    }
}

/// A thread that could not be started: the others stand down once they pass the start gate.
fn spawn_failed<T>(role: &str, error: std::io::Error, setup_failed: &AtomicBool) -> Result<T, Failure> {
    setup_failed.store(true, Ordering::Release);
    Err(Failure::runtime(format!("starting a {role} thread: {error}")))
}

/// The outcome of a thread, or why there is none.
fn join_outcome<T>(
    role: &str,
    handle: Result<ScopedJoinHandle<'_, Result<T, Failure>>, Failure>,
) -> Result<T, Failure> {
    match handle {
        Ok(handle) => {
            handle.join().unwrap_or_else(|_| Err(Failure::runtime(format!("a {role} thread panicked"))))
        }
        Err(failure) => Err(failure),
    }
}

/// The daemon's stats; None if they cannot be read (their figures are side notes of the run,
/// never a reason to fail it).
fn daemon_stats(server: &str) -> Option<StatsResponse> {
    let client = block_on(super::connect(server)).ok()?;
    block_on(client.stats()).ok()
}

/// The daemon's resident memory, from its stats.
fn resident_bytes(stats: Option<&StatsResponse>) -> Option<u64> {
    Some(stats?.process.resident_bytes).filter(|bytes| *bytes > 0)
}

/// The latencies of the forwarder shards that served publishes, from the daemon's stats.
fn server_latency(stats: Option<&StatsResponse>) -> Vec<ShardLatency> {
    let Some(stats) = stats else { return Vec::new() };
    stats
        .shards
        .iter()
        .filter(|shard| shard.shard != u32::MAX && shard.publish_latency.count > 0)
        .map(|shard| ShardLatency {
            shard: shard.shard,
            publish: shard.publish_latency.clone(),
            commit: shard.commit_latency.clone(),
        })
        .collect()
}

/// Runs the workload. `stop` ends publishing early (what was acknowledged is still drained);
/// `progress` is called once a second; `log` gets one line per setup step.
pub fn run(
    options: &WorkloadOptions,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
    log: &mut dyn FnMut(&str),
) -> Result<Report, Failure> {
    options.validate()?;
    let server = options.publish.server.as_str();
    let mut layout = layout(options);
    let resident_before = resident_bytes(daemon_stats(server).as_ref());
    // Listening before the subscription exists, which the daemon pushes as soon as it does.
    let receiver = match options.workload {
        Workload::Push => Some(PushReceiver::start(&options.receiver_host)?),
        _ => None,
    };
    if let Some(receiver) = &receiver {
        log(&format!("push receiver at {}", receiver.endpoint));
    }
    let setup_started = Instant::now();
    if let Some(name) = &options.publish.topic {
        let client = block_on(super::connect(server))?;
        block_on(client.get_topic(name)).map_err(|error| match error {
            ringpost_client::Error::Status(status) if status.code == ErrorCode::NotFound => {
                Failure::runtime(format!(
                    "NotFound: topic '{name}' does not exist; create it, or leave out --topic to publish to a fresh one"
                ))
            }
            other => Failure::from(other),
        })?;
    } else if let Err(failure) = create(server, &layout, receiver.as_ref().map(|r| r.endpoint.as_str())) {
        // Remove what was made before the failure; the failure is what the user needs to see.
        let _ = delete(server, &layout);
        return Err(failure);
    }
    if options.workload == Workload::Publish && layout.topics.len() * options.sources as usize > 1 {
        log_leaders(server, &layout.topics, log);
    }
    let multiplex = options.workload == Workload::Topics;
    if multiplex {
        let names: Vec<String> = layout.targets.iter().map(|target| target.name.clone()).collect();
        let forwarders = setup::lookup_subscriptions(server, &names);
        match forwarders {
            Ok(forwarders) => {
                for (target, forwarder) in layout.targets.iter_mut().zip(forwarders) {
                    target.forwarder = Some(forwarder);
                }
            }
            Err(failure) => {
                let _ = delete(server, &layout);
                return Err(failure);
            }
        }
    }
    let setup_seconds = setup_started.elapsed().as_secs_f64();
    if options.workload.has_subscribers() {
        log(&format!(
            "created {} topics and {} subscriptions in {setup_seconds:.2} s",
            layout.topics.len(),
            layout.targets.len()
        ));
    }
    if options.settle_seconds > 0 {
        log(&format!(
            "leaving the topics idle for {} s before reading resident memory",
            options.settle_seconds
        ));
        std::thread::sleep(std::time::Duration::from_secs(options.settle_seconds));
    }
    let resident_idle = resident_bytes(daemon_stats(server).as_ref());
    let threads_before = super::threads::cpu_ticks_by_thread();
    let result = measure(options, &layout, multiplex, receiver.as_ref(), stop, progress);
    let threads_cpu = super::threads::cpu_seconds_since(&threads_before);
    // One read after the run for both: the latencies then cover its last 10-20 s.
    let after = daemon_stats(server);
    let resident_after = resident_bytes(after.as_ref());
    let server_latency = server_latency(after.as_ref());
    // Cleaned up after a failed run too, so that repeated runs against a long-lived daemon do
    // not pile up topics and stored messages.
    let cleanup = match layout.created && options.cleanup {
        true => delete(server, &layout).err(),
        false => None,
    };
    let mut report = result?;
    report.threads_cpu = threads_cpu;
    report.setup_seconds = setup_seconds;
    report.server_latency = server_latency;
    if multiplex {
        let forwarders: std::collections::HashSet<&str> =
            layout.targets.iter().filter_map(|target| target.forwarder.as_deref()).collect();
        report.forwarders = Some(forwarders.len());
    }
    report.resident = match (resident_before, resident_idle, resident_after) {
        (Some(before_bytes), Some(idle_bytes), Some(after_bytes)) => {
            Some(Resident { before_bytes, idle_bytes, after_bytes })
        }
        _ => None,
    };
    if let Some(failure) = cleanup {
        report.warnings.push(format!("could not delete the benchmark's topics: {}", failure.message));
    }
    Ok(report)
}

fn measure(
    options: &WorkloadOptions,
    layout: &Layout,
    multiplex: bool,
    receiver: Option<&PushReceiver>,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Report, Failure> {
    let publish = &options.publish;
    let workload = options.workload;
    let track = workload.has_subscribers();
    let publishers = publish.publishers;
    let subscriber_threads = if track { options.subscriber_threads.min(layout.targets.len()) } else { 0 };
    let template = payload_template(publish.size_bytes);
    let live_publishers: Vec<LiveStats> = (0..publishers).map(|_| LiveStats::new()).collect();
    let live_subscribers: Vec<LiveStats> = (0..subscriber_threads).map(|_| LiveStats::new()).collect();
    let setup_failed = AtomicBool::new(false);
    let abort = AtomicBool::new(false);
    let failed_requests = AtomicU64::new(0);
    let start = StartGate::new();
    let running = AtomicUsize::new(publishers + subscriber_threads);
    let publishers_running = AtomicUsize::new(publishers);
    let acknowledged_per_topic: Vec<AtomicU64> = layout.topics.iter().map(|_| AtomicU64::new(0)).collect();
    let warnings = Mutex::new(Vec::new());
    let resident_stored_bytes = AtomicU64::new(0);
    let publisher_context = PublisherContext {
        options: publish,
        topics: &layout.topics,
        template: &template,
        track,
        stop,
        abort: &abort,
        failed_requests: &failed_requests,
        setup_failed: &setup_failed,
        start: &start,
        live: &live_publishers,
        acknowledged_per_topic: &acknowledged_per_topic,
        warnings: &warnings,
    };
    let subscriber_context = SubscriberContext {
        server: &publish.server,
        targets: &layout.targets,
        threads: subscriber_threads,
        window: options.window,
        multiplex,
        wait_for_publishers: workload == Workload::Backlog,
        pin_offset: publish.pin.then_some(publishers),
        stop,
        abort: &abort,
        setup_failed: &setup_failed,
        start: &start,
        live: &live_subscribers,
        publishers_running: &publishers_running,
        acknowledged_per_topic: &acknowledged_per_topic,
        warnings: &warnings,
        resident_stored_bytes: &resident_stored_bytes,
    };
    // The receiver shows its figures where the one subscriber thread of W2 would.
    let unused_live = LiveStats::new();
    let receiver_context = ReceiverContext {
        stop,
        setup_failed: &setup_failed,
        start: &start,
        live: live_subscribers.first().unwrap_or(&unused_live),
        publishers_running: &publishers_running,
        acknowledged: &acknowledged_per_topic[0],
    };
    latency::start_clock();
    let reporter = std::thread::current();
    let (publisher_outcomes, subscriber_outcomes) = std::thread::scope(|scope| {
        let publisher_handles: Vec<_> = (0..publishers)
            .map(|publisher| {
                let (context, counted_out) = (
                    &publisher_context,
                    CountedOut {
                        counters: [Some(&running), Some(&publishers_running)],
                        reporter: reporter.clone(),
                    },
                );
                std::thread::Builder::new()
                    .name(format!("publisher-{publisher}"))
                    .spawn_scoped(scope, move || {
                        let _counted_out = counted_out;
                        publisher_run(publisher, context)
                    })
                    .or_else(|error| spawn_failed("publisher", error, &setup_failed))
            })
            .collect();
        let receiver_handle = receiver.map(|receiver| {
            let counted_out = CountedOut { counters: [Some(&running), None], reporter: reporter.clone() };
            let context = &receiver_context;
            std::thread::Builder::new()
                .name("receiver-run".to_owned())
                .spawn_scoped(scope, move || {
                    let _counted_out = counted_out;
                    receiver_run(receiver, context)
                })
                .or_else(|error| spawn_failed("receiver", error, &setup_failed))
        });
        // The push workload's one subscriber is its receiver.
        let subscriber_threads = if receiver.is_some() { 0 } else { subscriber_threads };
        let subscriber_handles: Vec<_> = (0..subscriber_threads)
            .map(|thread| {
                let (context, counted_out) = (
                    &subscriber_context,
                    CountedOut { counters: [Some(&running), None], reporter: reporter.clone() },
                );
                std::thread::Builder::new()
                    .name(format!("subscriber-{thread}"))
                    .spawn_scoped(scope, move || {
                        let _counted_out = counted_out;
                        subscriber_run(thread, context)
                    })
                    .or_else(|error| spawn_failed("subscriber", error, &setup_failed))
            })
            .collect();
        let subscriber_handles: Vec<_> = subscriber_handles.into_iter().chain(receiver_handle).collect();
        // Threads that did not start never arrive; the ones that did see `setup_failed` and
        // stand down.
        let started = publisher_handles.iter().filter(|handle| handle.is_ok()).count()
            + subscriber_handles.iter().filter(|handle| handle.is_ok()).count();
        start.open_when_arrived(started);
        let watched = Watched {
            publishers: &live_publishers,
            subscribers: &live_subscribers,
            running: &running,
            size_bytes: publish.size_bytes,
        };
        report_progress(&watched, progress);
        let publisher_outcomes: Vec<Result<Option<PublisherOutcome>, Failure>> =
            publisher_handles.into_iter().map(|handle| join_outcome("publisher", handle)).collect();
        let subscriber_outcomes: Vec<Result<Option<SubscriberOutcome>, Failure>> =
            subscriber_handles.into_iter().map(|handle| join_outcome("subscriber", handle)).collect();
        (publisher_outcomes, subscriber_outcomes)
    });

    let mut report = Report {
        topic: match layout.topics.len() {
            1 => layout.topics[0].clone(),
            count => format!("{count} topics"),
        },
        setup_seconds: 0.0,
        messages_acknowledged: live_publishers.iter().map(|s| s.messages.load(Ordering::Relaxed)).sum(),
        messages_failed: live_publishers.iter().map(|s| s.messages_failed.load(Ordering::Relaxed)).sum(),
        requests: 0,
        seconds: 0.0,
        latency_us: new_histogram(),
        send_lag_us_max: 0,
        first_error: None,
        delivery: None,
        warnings: std::mem::take(&mut *warnings.lock().unwrap()),
        resident: None,
        resident_stored_bytes: Some(resident_stored_bytes.load(Ordering::Relaxed)).filter(|bytes| *bytes > 0),
        forwarders: None,
        server_latency: Vec::new(),
        threads_cpu: Vec::new(),
    };
    if abort.load(Ordering::Relaxed) {
        report.warnings.push(format!(
            "publishing stopped early: {} requests failed (FAILED_REQUESTS_BEFORE_ABORT)",
            failed_requests.load(Ordering::Relaxed)
        ));
    }
    let mut failure = None;
    let mut first_started: Option<Instant> = None;
    let mut last_finished: Option<Instant> = None;
    let mut acknowledged: Vec<IdSet> = vec![IdSet::new(); if track { layout.topics.len() } else { 0 }];
    for outcome in publisher_outcomes {
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
                for (merged, ids) in acknowledged.iter_mut().zip(&outcome.acknowledged_ids) {
                    merged.union_with(ids);
                }
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
    if track {
        let mut delivery = DeliveryReport {
            delivered: 0,
            duplicates: 0,
            lost: 0,
            unexpected: 0,
            seconds: 0.0,
            latency_us: new_histogram(),
            acknowledged: 0,
            acknowledge_failed: 0,
            timed_out: false,
            first_error: None,
        };
        let mut delivered_by_target: Vec<Option<IdSet>> = vec![None; layout.targets.len()];
        let mut opened: Option<Instant> = None;
        let mut last_delivery: Option<Instant> = None;
        for outcome in subscriber_outcomes {
            match outcome {
                Ok(Some(outcome)) => {
                    delivery.latency_us.add(&outcome.latency_us).expect("histograms with equal bounds merge");
                    delivery.duplicates += outcome.duplicates;
                    delivery.acknowledged += outcome.acknowledged;
                    delivery.acknowledge_failed += outcome.acknowledge_failed;
                    delivery.timed_out |= outcome.timed_out;
                    if delivery.first_error.is_none() {
                        delivery.first_error = outcome.first_error;
                    }
                    opened = Some(opened.map_or(outcome.opened, |t| t.min(outcome.opened)));
                    if let Some(last) = outcome.last_delivery {
                        last_delivery = Some(last_delivery.map_or(last, |t| t.max(last)));
                    }
                    for (index, ids) in outcome.targets.into_iter().zip(outcome.delivered) {
                        delivered_by_target[index] = Some(ids);
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        let empty = IdSet::new();
        for (target, delivered) in layout.targets.iter().zip(&delivered_by_target) {
            let delivered = delivered.as_ref().unwrap_or(&empty);
            let expected = &acknowledged[target.topic];
            delivery.delivered += delivered.len();
            delivery.lost += expected.count_missing_from(delivered);
            delivery.unexpected += delivered.count_missing_from(expected);
        }
        // Delivery time starts with the first publish, except for the backlog, whose drain
        // starts when its stream opens.
        let delivery_started = if workload == Workload::Backlog { opened } else { first_started };
        if let (Some(started), Some(last)) = (delivery_started, last_delivery) {
            delivery.seconds = last.saturating_duration_since(started).as_secs_f64();
        }
        report.delivery = Some(delivery);
    }
    match failure {
        Some(failure) => Err(failure),
        None => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(workload: Workload) -> WorkloadOptions {
        WorkloadOptions::new(workload, PublishOptions::default())
    }

    #[test]
    fn layouts_of_the_workloads() {
        let publish = layout(&options(Workload::Publish));
        assert_eq!((publish.topics.len(), publish.targets.len()), (1, 0));
        let fanout = layout(&options(Workload::Fanout));
        assert_eq!((fanout.topics.len(), fanout.targets.len()), (1, SUBSCRIPTIONS_DEFAULT));
        assert!(fanout.targets.iter().all(|target| target.topic == 0));
        let mut topics = options(Workload::Topics);
        topics.topics = 12;
        let topics = layout(&topics);
        assert_eq!((topics.topics.len(), topics.targets.len()), (12, 12));
        assert_eq!(topics.targets[7].topic, 7);
        assert!(topics.topics[7].ends_with("-t00007"));
        let backlog = layout(&options(Workload::Backlog));
        assert_eq!((backlog.topics.len(), backlog.targets.len(), backlog.created), (1, 1, true));
    }

    /// Every workload end to end against a daemon in this process, small: each acknowledged
    /// message is delivered on every subscription, none is lost, and the counts add up.
    #[test]
    fn every_workload_delivers_every_acknowledged_message() {
        let daemon = crate::bench::embedded::EmbeddedDaemon::start(None, false, false, None).unwrap();
        let stop = AtomicBool::new(false);
        for (workload, messages) in [
            (Workload::Publish, 2000),
            (Workload::EndToEnd, 2000),
            (Workload::Fanout, 1000),
            (Workload::Topics, 1000),
            (Workload::Backlog, 3000),
            (Workload::Push, 1000),
        ] {
            let mut options = options(workload);
            options.publish.server = daemon.address.clone();
            options.publish.messages = messages;
            options.publish.size_bytes = 64;
            options.publish.batch = 10;
            options.subscriptions = 3;
            options.subscriber_threads = 2;
            options.topics = 20;
            options.window = 100;
            let report = run(&options, &stop, &mut |_| {}, &mut |_| {}).unwrap();
            assert_eq!(report.messages_acknowledged, messages, "{workload:?}");
            let resident = report.resident.expect("the daemon's stats give its resident memory");
            assert!(resident.before_bytes > 0 && resident.idle_bytes > 0 && resident.after_bytes > 0);
            assert_eq!(report.resident_stored_bytes.is_some(), workload == Workload::Backlog, "{workload:?}");
            assert!(
                report.server_latency.iter().any(|shard| shard.publish.count > 0 && shard.commit.count > 0),
                "{workload:?}: the serving shard's latencies are read from its stats"
            );
            assert!(report.problems().is_empty(), "{workload:?}: {:?}", report.problems());
            let subscriptions = options.subscription_count() as u64;
            match &report.delivery {
                None => assert_eq!(workload, Workload::Publish),
                Some(delivery) => {
                    let expected =
                        if workload == Workload::Topics { messages } else { messages * subscriptions };
                    assert_eq!(
                        (delivery.delivered, delivery.lost, delivery.unexpected),
                        (expected, 0, 0),
                        "{workload:?}"
                    );
                    assert_eq!(
                        delivery.latency_us.len(),
                        expected,
                        "{workload:?}: one latency per first delivery"
                    );
                    assert!(delivery.acknowledged >= expected, "{workload:?}");
                }
            }
        }
    }

    #[test]
    fn validation_of_subscriber_options() {
        assert!(options(Workload::EndToEnd).validate().is_ok());
        let refused = |change: fn(&mut WorkloadOptions)| {
            let mut options = options(Workload::Fanout);
            change(&mut options);
            options.validate().unwrap_err().exit_code
        };
        assert_eq!(refused(|o| o.window = 0), crate::bench::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.subscriptions = 0), crate::bench::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.publish.size_bytes = 4), crate::bench::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.publish.topic = Some("t".into())), crate::bench::EXIT_CODE_USAGE);
        assert_eq!(refused(|o| o.subscriber_threads = 0), crate::bench::EXIT_CODE_USAGE);
        let mut publish_only = options(Workload::Publish);
        publish_only.publish.size_bytes = 1;
        assert!(publish_only.validate().is_ok(), "publish alone needs no stamp");
    }
}
