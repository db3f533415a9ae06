//! The daemon's figures in the OpenMetrics text format that Prometheus scrapes, encoded from
//! what the stats operation gathers (`api::stats::Stats`) and the catalog's view of the
//! cluster. No I/O here: a scrape gathers, this encodes. Each scrape builds a registry of its
//! own, so the shards keep plain figures and nothing is shared with them between scrapes.
//!
//! Names follow Prometheus's conventions (units last, `_total` on counters) and Google Cloud
//! Monitoring's metric names where one exists (`num_undelivered_messages`,
//! `oldest_unacked_message_age`). Topics and subscriptions are labels, so their number is
//! bounded per scrape (`METRICS_TOPICS_MAX`, `METRICS_SUBSCRIPTIONS_MAX`, in name order); what
//! is left out is counted.

use crate::api::cluster::ClusterStatus;
use crate::api::stats::{LatencySummary, ReplicaStats, Stats, SubscriptionStats, TopicStats};
use crate::ids::NodeId;
use crate::metrics::histogram::{DurationHistogram, DURATION_BUCKETS, DURATION_BUCKETS_US};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

/// Topics one scrape exports; the rest are counted in `ringpost_metrics_topics_omitted`.
pub const METRICS_TOPICS_MAX: usize = 1000;
/// Subscriptions one scrape exports; the rest are counted in
/// `ringpost_metrics_subscriptions_omitted`.
pub const METRICS_SUBSCRIPTIONS_MAX: usize = 5000;

/// The content type of what `encode_metrics` writes.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

/// What the shards and the gRPC API counted, for a scrape.
#[derive(Debug, Default)]
pub struct Counted {
    /// Each shard's figures (`Router::shard_figures`): the router's, then each forwarder's,
    /// in the order of `Stats::shards`.
    pub shards: Vec<(u32, crate::metrics::shard::ShardFigures)>,
    /// The gRPC API's requests by method (`net::grpc::counting`).
    pub grpc_requests: Vec<crate::metrics::requests::CommandFigures>,
    pub grpc_connections: u64,
    /// The push client's pushes (`push::client`).
    pub push: crate::push::client::PushFigures,
    /// The topics whose sources follow their load, at most `METRICS_TOPICS_MAX`
    /// (`Router::followed_topics`).
    pub followed: Vec<crate::router::follow::FollowedTopic>,
}

/// A histogram's sum, count, and buckets by upper bound (not cumulative).
type HistogramFigures = (f64, u64, Vec<(f64, u64)>);

/// A histogram whose buckets were counted elsewhere (by the shards), encoded as Prometheus
/// histograms are.
#[derive(Debug, Default)]
struct CountedHistogram {
    figures: std::sync::Mutex<HistogramFigures>,
}

impl prometheus_client::metrics::TypedMetric for CountedHistogram {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for CountedHistogram {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        let figures = self.figures.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (sum, count, buckets) = &*figures;
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(*sum, *count, buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        <Self as prometheus_client::metrics::TypedMetric>::TYPE
    }
}
type FloatGauge = Gauge<f64, AtomicU64>;

/// A family of gauges or counters, registered under its name when the scrape is encoded.
struct Families {
    registry: Registry,
}

impl Families {
    fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Family<Labels, FloatGauge> {
        let family = Family::<Labels, FloatGauge>::default();
        match unit {
            Some(unit) => self.registry.register_with_unit(name, help, unit, family.clone()),
            None => self.registry.register(name, help, family.clone()),
        }
        family
    }

    /// A counter family; `name` without `_total`, which the encoding adds.
    fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Family<Labels, Counter> {
        let family = Family::<Labels, Counter>::default();
        match unit {
            Some(unit) => self.registry.register_with_unit(name, help, unit, family.clone()),
            None => self.registry.register(name, help, family.clone()),
        }
        family
    }
}

fn shard_label(shard: u32) -> String {
    match shard {
        u32::MAX => "router".to_owned(),
        shard => shard.to_string(),
    }
}

/// A family of histograms counted by the shards, registered under `name` in seconds.
fn histograms(families: &mut Families, name: &str, help: &str) -> Family<Labels, CountedHistogram> {
    let family = Family::<Labels, CountedHistogram>::default();
    families.registry.register_with_unit(name, help, Unit::Seconds, family.clone());
    family
}

/// Sets one histogram of `family` to `histogram`'s counts; one that measured nothing is shown
/// with none, so that the series exists before its first sample.
fn set_histogram(family: &Family<Labels, CountedHistogram>, labels: &Labels, histogram: &DurationHistogram) {
    let counts = match histogram.buckets.len() {
        length if length == DURATION_BUCKETS + 1 => histogram.buckets.clone(),
        _ => vec![0; DURATION_BUCKETS + 1],
    };
    let bounds = DURATION_BUCKETS_US.iter().map(|micros| *micros as f64 / 1e6).chain([f64::INFINITY]);
    let buckets: Vec<(f64, u64)> = bounds.zip(counts).collect();
    let figures = (histogram.sum_us as f64 / 1e6, histogram.count(), buckets);
    *family.get_or_create(labels).figures.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = figures;
}

/// Requests of both protocols by shard, command and status code, and their durations by
/// command (every shard's buckets added together, as a query would). The gRPC API's calls run
/// on its own threads: their shard is `grpc`, and their commands are named as the native
/// protocol's (`publish`, `streaming_pull`).
fn encode_requests(families: &mut Families, counted: &Counted) {
    use crate::protocol::native::{command_name, status_name};
    let counts = families.counter(
        "requests",
        "Requests answered, by protocol (native or grpc), shard, command and status code (ok, or the error's)",
        None,
    );
    let durations = histograms(
        families,
        "request_duration",
        "Requests from dispatch to answer, a publish's durable commit included, by protocol and command (streams left out)",
    );
    let native =
        counted.shards.iter().map(|(shard, figures)| ("native", shard_label(*shard), &figures.commands));
    let grpc = std::iter::once(("grpc", "grpc".to_owned(), &counted.grpc_requests));
    let mut totals: std::collections::BTreeMap<(&str, String), DurationHistogram> = Default::default();
    for (protocol, shard, commands) in native.chain(grpc) {
        for command in commands {
            let name = match protocol {
                "grpc" => crate::net::grpc::counting::method_name(command.command),
                _ => command_name(command.command),
            };
            for (code, count) in &command.codes {
                let labels: Labels = vec![
                    ("protocol", protocol.to_owned()),
                    ("shard", shard.clone()),
                    ("command", name.clone()),
                    ("code", status_name(*code)),
                ];
                counts.get_or_create(&labels).inc_by(*count);
            }
            totals.entry((protocol, name)).or_default().add(&command.duration);
        }
    }
    for ((protocol, command), histogram) in totals {
        set_histogram(&durations, &vec![("protocol", protocol.to_owned()), ("command", command)], &histogram);
    }
}

/// What each shard measured besides its requests: publish, commit and delivery latencies,
/// each data directory's writes, and connections.
fn encode_shards(families: &mut Families, stats: &Stats, counted: &Counted) {
    let publish_ack = histograms(
        families,
        "publish_ack_latency",
        "Publish requests from the checked request to their durable (and replicated) result, by shard",
    );
    let commit = histograms(
        families,
        "commit_latency",
        "Commits of a shard's logs, from the write issued to durable on a quorum of its data directories, by shard",
    );
    let delivery = histograms(
        families,
        "delivery_latency",
        "Messages at their first delivery, from their publish time (this node's clock) to the delivery leaving the shard, by shard",
    );
    let writes = histograms(
        families,
        "data_directory_write_latency",
        "Writes of commits to a data directory, issued to done (durable: segment files are written with O_DSYNC)",
    );
    let syncs = histograms(
        families,
        "data_directory_sync_latency",
        "fdatasync calls after a commit's write, where a directory cannot take O_DSYNC writes",
    );
    let written = families.counter(
        "data_directory_written",
        "Bytes of commits written to a data directory",
        Some(Unit::Bytes),
    );
    let write_errors =
        families.counter("data_directory_write_errors", "Writes to a data directory that failed", None);
    let connections =
        families.gauge("connections", "Connections open, by protocol and shard (gRPC's: shard grpc)", None);
    connections
        .get_or_create(&vec![("protocol", "grpc".to_owned()), ("shard", "grpc".to_owned())])
        .set(counted.grpc_connections as f64);
    let flow = FlowFamilies::new(families);
    for (position, (shard, figures)) in counted.shards.iter().enumerate() {
        let labels: Labels = vec![("shard", shard_label(*shard))];
        if *shard != u32::MAX {
            flow.set(&labels, &figures.flow);
        }
        set_histogram(&commit, &labels, &figures.commit);
        // The router shard publishes and delivers nothing.
        if *shard != u32::MAX {
            set_histogram(&publish_ack, &labels, &figures.publish_ack);
            set_histogram(&delivery, &labels, &figures.delivery);
        }
        connections
            .get_or_create(&vec![("protocol", "native".to_owned()), ("shard", shard_label(*shard))])
            .set(figures.connections as f64);
        // The shard's directories in the stats, in the same order as their figures' copies.
        let paths = stats.shards.get(position).filter(|stats| stats.shard == *shard);
        for directory in &figures.directories {
            let path = paths
                .and_then(|stats| stats.directories.get(directory.copy as usize))
                .map_or_else(|| directory.copy.to_string(), |status| status.path.clone());
            let labels: Labels = vec![("shard", shard_label(*shard)), ("path", path)];
            set_histogram(&writes, &labels, &directory.writes);
            set_histogram(&syncs, &labels, &directory.syncs);
            written.get_or_create(&labels).inc_by(directory.written_bytes);
            write_errors.get_or_create(&labels).inc_by(directory.write_errors);
        }
    }
}

/// A forwarder shard's flow control (`subscription::outstanding`, `topic::rate`).
struct FlowFamilies {
    outstanding_messages: Family<Labels, FloatGauge>,
    outstanding_bytes: Family<Labels, FloatGauge>,
    paused: Family<Labels, Counter>,
    slowed: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    held_bytes: Family<Labels, FloatGauge>,
}

impl FlowFamilies {
    fn new(families: &mut Families) -> FlowFamilies {
        FlowFamilies {
            outstanding_messages: families.gauge(
                "outstanding_messages",
                "Messages a shard's subscribers hold, delivered and not yet acknowledged, by shard",
                None,
            ),
            outstanding_bytes: families.gauge(
                "outstanding",
                "Bytes of messages a shard's subscribers hold, delivered and not yet acknowledged, by shard",
                Some(Unit::Bytes),
            ),
            paused: families.counter(
                "deliveries_paused",
                "Pulls and streams with messages to deliver that paused at the shard's or their topic's outstanding limit, by shard",
                None,
            ),
            slowed: families.counter(
                "publishes_slowed",
                "Publishes held back on their shard for their topic's publish rate, by shard",
                None,
            ),
            refused: families.counter(
                "publishes_refused_by_limit",
                "Publishes refused with ResourceExhausted and a retry delay, by shard and limit (messages_rate, bytes_rate, held_bytes)",
                None,
            ),
            held_bytes: families.gauge(
                "publish_held",
                "Bytes of publishes a shard holds back for their topics' publish rates now, by shard",
                Some(Unit::Bytes),
            ),
        }
    }

    fn set(&self, labels: &Labels, flow: &crate::metrics::shard::FlowFigures) {
        self.outstanding_messages.get_or_create(labels).set(flow.outstanding_messages as f64);
        self.outstanding_bytes.get_or_create(labels).set(flow.outstanding_bytes as f64);
        self.paused.get_or_create(labels).inc_by(flow.deliveries_paused);
        self.slowed.get_or_create(labels).inc_by(flow.publishes_slowed);
        for (limit, count) in [
            ("messages_rate", flow.publishes_refused_messages_rate),
            ("bytes_rate", flow.publishes_refused_bytes_rate),
            ("held_bytes", flow.publishes_refused_held_bytes),
        ] {
            let mut labels = labels.clone();
            labels.push(("limit", limit.to_owned()));
            self.refused.get_or_create(&labels).inc_by(count);
        }
        self.held_bytes.get_or_create(labels).set(flow.publish_held_bytes as f64);
    }
}

/// A latency window's percentiles as gauges labelled by `percentile` (50, 99, 99.9, 100).
/// Not `quantile`: OpenMetrics keeps that label for summaries, and these are a window's
/// figures, not a summary's.
fn set_percentiles(family: &Family<Labels, FloatGauge>, labels: &Labels, latency: &LatencySummary) {
    for (percentile, micros) in
        [("50", latency.p50_us), ("99", latency.p99_us), ("99.9", latency.p999_us), ("100", latency.max_us)]
    {
        let mut labels = labels.clone();
        labels.push(("percentile", percentile.to_owned()));
        family.get_or_create(&labels).set(micros as f64 / 1e6);
    }
}

/// Everything a scrape shows, in the OpenMetrics text format. `version`: the daemon's.
/// `cluster`: the catalog's group as this node sees it, `None` for a node alone.
pub fn encode_metrics(
    stats: &Stats,
    cluster: Option<&ClusterStatus>,
    counted: &Counted,
    version: &str,
) -> String {
    let mut families = Families { registry: Registry::with_prefix("ringpost") };
    encode_requests(&mut families, counted);
    encode_shards(&mut families, stats, counted);
    encode_pushes(&mut families, &counted.push);

    let build = families.gauge("build_info", "The daemon's version (the value is always 1)", None);
    build.get_or_create(&vec![("version", version.to_owned())]).set(1.0);

    let process = encode_process(stats);
    encode_shard_health(&mut families, stats);
    encode_topics(&mut families, stats);
    encode_followed(&mut families, &counted.followed);
    if let Some(cluster) = cluster {
        encode_cluster(&mut families, cluster);
    }

    let mut text = String::new();
    encode(&mut text, &process.registry).expect("encoding into a String cannot fail");
    // Each registry ends with `# EOF`; the text ends with the last one's only.
    if let Some(cut) = text.rfind("# EOF\n") {
        text.truncate(cut);
    }
    encode(&mut text, &families.registry).expect("encoding into a String cannot fail");
    text
}

/// The topics whose sources follow their load: how many they have, their bounds, and the
/// catalog's leader's last decision (1 on the decision's series).
fn encode_followed(families: &mut Families, followed: &[crate::router::follow::FollowedTopic]) {
    let sources = families.gauge(
        "topic_sources",
        "Publish sources of a topic whose number follows its load (--sources auto)",
        None,
    );
    let minimum = families.gauge("topic_sources_min", "The fewest sources such a topic keeps", None);
    let maximum = families.gauge("topic_sources_max", "The most sources such a topic gets", None);
    let decision = families.gauge(
        "topic_sources_last_decision",
        "1 on the last decision of the catalog's leader other than keeping the sources (add, or retire), only on that leader",
        None,
    );
    for topic in followed {
        let labels: Labels = vec![("topic", topic.name.clone())];
        sources.get_or_create(&labels).set(topic.sources as f64);
        minimum.get_or_create(&labels).set(topic.bounds.min as f64);
        maximum.get_or_create(&labels).set(topic.bounds.max as f64);
        if let Some(last) = topic.last_decision {
            let labels: Labels = vec![("topic", topic.name.clone()), ("decision", last.name().to_owned())];
            decision.get_or_create(&labels).set(1.0);
        }
    }
}

/// Push subscriptions' requests by how they ended, and their latency.
fn encode_pushes(families: &mut Families, push: &crate::push::client::PushFigures) {
    let requests = families.counter(
        "push_requests",
        "Push requests by outcome: the status's class (2xx acknowledges), connection_error or timeout",
        None,
    );
    for (class, count) in &push.requests {
        requests.get_or_create(&vec![("class", (*class).to_owned())]).inc_by(*count);
    }
    let latency = histograms(
        families,
        "push_latency",
        "Push requests, from the push client taking them to their outcome",
    );
    set_histogram(&latency, &Vec::new(), &push.latency);
}

/// The process's figures, under the names Prometheus's own clients give them (a registry
/// without the `ringpost` prefix).
fn encode_process(stats: &Stats) -> Families {
    let mut process = Families { registry: Registry::default() };
    process
        .gauge("process_resident_memory", "Resident memory", Some(Unit::Bytes))
        .get_or_create(&Vec::new())
        .set(stats.process.resident_bytes as f64);
    process
        .gauge("process_open_fds", "Open file descriptors", None)
        .get_or_create(&Vec::new())
        .set(stats.process.open_files as f64);
    process
        .gauge("process_max_fds", "The soft limit on open file descriptors", None)
        .get_or_create(&Vec::new())
        .set(stats.process.open_files_limit as f64);
    process
}

/// Each shard's topics, data directories (fenced, repairs) and latency windows.
fn encode_shard_health(families: &mut Families, stats: &Stats) {
    let shard_topics =
        families.gauge("shard_topics", "Topics a shard serves (the router: in the catalog)", None);
    let fenced = families.gauge(
        "data_directory_fenced",
        "1 when the data directory is fenced (left out of every write after a failure), else 0",
        None,
    );
    let repairs = families.counter(
        "data_directory_repairs",
        "Copies of batches rewritten from good ones in a shard's data directories since start",
        None,
    );
    let publish_latency = families.gauge(
        "publish_ack_latency_window",
        "Publish requests from the checked request to their durable (and replicated) result, over the last 10 to 20 seconds, by percentile",
        Some(Unit::Seconds),
    );
    let commit_latency = families.gauge(
        "commit_latency_window",
        "Commits of a shard's logs, from the write issued to durable on a quorum of its data directories, over the last 10 to 20 seconds, by percentile",
        Some(Unit::Seconds),
    );
    let quarantined = families.gauge(
        "shard_quarantined_topics",
        "Topics left unserved at start because they were damaged",
        None,
    );
    for shard in &stats.shards {
        let labels: Labels = vec![("shard", shard_label(shard.shard))];
        shard_topics.get_or_create(&labels).set(shard.topics as f64);
        repairs.get_or_create(&labels).inc_by(shard.repairs);
        quarantined.get_or_create(&labels).set(shard.quarantined.len() as f64);
        for directory in &shard.directories {
            let labels: Labels = vec![("shard", shard_label(shard.shard)), ("path", directory.path.clone())];
            fenced.get_or_create(&labels).set(if directory.fenced.is_empty() { 0.0 } else { 1.0 });
        }
        if shard.shard != u32::MAX {
            set_percentiles(&publish_latency, &labels, &shard.publish_latency);
            set_percentiles(&commit_latency, &labels, &shard.commit_latency);
        }
    }
}

/// `first`, then the topic's label, then for a topic of several sources its `source` label:
/// each source is a log of its own on its own shard, so its figures are series of their own
/// (without it, two sources on one node's shards would write one series twice). A topic of one
/// source keeps the label set it always had.
fn topic_labels(topic: &TopicStats, first: Labels) -> Labels {
    let mut labels = first;
    labels.push(("topic", topic.name.clone()));
    if topic.several_sources {
        labels.push(("source", topic.source.get().to_string()));
    }
    labels
}

/// Each topic's figures, its subscriptions' and its replica's, up to `METRICS_TOPICS_MAX`
/// topics and `METRICS_SUBSCRIPTIONS_MAX` subscriptions, and how many were left out.
fn encode_topics(families: &mut Families, stats: &Stats) {
    let topic_offsets = families.counter(
        "topic_offsets",
        "Offsets the topic's log has handed out since it was created: its messages, and in a replicated topic one more at each change of leader",
        None,
    );
    let topic_stored = families.gauge(
        "topic_stored",
        "Bytes of the topic's segment files in one data directory",
        Some(Unit::Bytes),
    );
    let topic_rate = families.gauge(
        "topic_published_per_second",
        "Messages published per second over the last few seconds",
        None,
    );
    let topic_messages = families.counter(
        "topic_published_messages",
        "Messages published to the topic since its shard took it",
        None,
    );
    let topic_bytes = families.counter(
        "topic_published",
        "Bytes of the messages published to the topic since its shard took it, as stored (a record header each)",
        Some(Unit::Bytes),
    );
    let subscription_families = SubscriptionFamilies::register(families);
    let replica_families = ReplicaFamilies::register(families);
    let mut subscriptions_exported = 0usize;
    let mut subscriptions_omitted = 0usize;
    for topic in stats.topics.iter().take(METRICS_TOPICS_MAX) {
        let labels = topic_labels(topic, Vec::new());
        topic_offsets.get_or_create(&labels).inc_by(topic.end_offset);
        topic_stored.get_or_create(&labels).set(topic.disk_bytes as f64);
        topic_rate.get_or_create(&labels).set(topic.published_per_second as f64);
        topic_messages.get_or_create(&labels).inc_by(topic.published_messages_total);
        topic_bytes.get_or_create(&labels).inc_by(topic.published_bytes_total);
        for subscription in &topic.subscriptions {
            if subscriptions_exported == METRICS_SUBSCRIPTIONS_MAX {
                subscriptions_omitted += 1;
                continue;
            }
            subscriptions_exported += 1;
            subscription_families.set(topic, subscription);
        }
        if let Some(replica) = &topic.replication {
            replica_families.set(topic, replica);
        }
    }
    let topics_omitted = stats.topics.len().saturating_sub(METRICS_TOPICS_MAX);
    let subscriptions_omitted = subscriptions_omitted
        + stats.topics.iter().skip(METRICS_TOPICS_MAX).map(|topic| topic.subscriptions.len()).sum::<usize>();
    families
        .gauge(
            "metrics_topics_omitted",
            "Topics this scrape left out (past METRICS_TOPICS_MAX, in name order)",
            None,
        )
        .get_or_create(&Vec::new())
        .set(topics_omitted as f64);
    families
        .gauge(
            "metrics_subscriptions_omitted",
            "Subscriptions this scrape left out (past METRICS_SUBSCRIPTIONS_MAX, or of topics left out)",
            None,
        )
        .get_or_create(&Vec::new())
        .set(subscriptions_omitted as f64);
}

/// The families of a subscription's figures, labelled by subscription and topic.
struct SubscriptionFamilies {
    backlog_bytes: Family<Labels, FloatGauge>,
    redelivered: Family<Labels, Counter>,
    acknowledged: Family<Labels, Counter>,
    dead_lettered: Family<Labels, Counter>,
    open_streams: Family<Labels, FloatGauge>,
    undelivered: Family<Labels, FloatGauge>,
    oldest: Family<Labels, FloatGauge>,
    outstanding: Family<Labels, FloatGauge>,
    delivered: Family<Labels, Counter>,
    expired: Family<Labels, Counter>,
    push_window: Family<Labels, FloatGauge>,
    push_outstanding: Family<Labels, FloatGauge>,
    push_failures: Family<Labels, FloatGauge>,
    push_requests: Family<Labels, Counter>,
}

impl SubscriptionFamilies {
    fn register(families: &mut Families) -> SubscriptionFamilies {
        let backlog_bytes = families.gauge(
            "subscription_backlog",
            "Bytes of the topic's log from the oldest unacknowledged message on, as stored (Cloud Monitoring's backlog_bytes)",
            Some(Unit::Bytes),
        );
        let redelivered = families.counter(
            "subscription_redelivered_messages",
            "Deliveries after a message's first (after a nack or an expired lease), since the serving shard took the subscription",
            None,
        );
        let acknowledged = families.counter(
            "subscription_acknowledged_messages",
            "Messages acknowledged durably, since the serving shard took the subscription",
            None,
        );
        let dead_lettered = families.counter(
            "subscription_dead_lettered_messages",
            "Messages published to the dead-letter topic after their delivery attempts ran out, since the serving shard took the subscription",
            None,
        );
        let open_streams = families.gauge(
            "subscription_open_streams",
            "Streaming pulls open on the subscription, on either protocol",
            None,
        );
        let undelivered = families.gauge(
            "subscription_num_undelivered_messages",
            "Messages published and not acknowledged (Cloud Monitoring's num_undelivered_messages)",
            None,
        );
        let oldest = families.gauge(
            "subscription_oldest_unacked_message_age",
            "Age of the oldest unacknowledged message; 0 when there is none (Cloud Monitoring's oldest_unacked_message_age)",
            Some(Unit::Seconds),
        );
        let outstanding = families.gauge(
            "subscription_outstanding_messages",
            "Messages delivered whose lease has not ended",
            None,
        );
        let delivered = families.counter(
            "subscription_delivered_messages",
            "Deliveries, redeliveries included, since the serving shard took the subscription",
            None,
        );
        let expired = families.counter(
            "subscription_expired_leases",
            "Leases that ran out unacknowledged (their messages are delivered again), since the serving shard took the subscription",
            None,
        );
        let push_window = families.gauge(
            "push_window",
            "A push subscription's window: pushes that may be outstanding now (0 while none is being pushed)",
            None,
        );
        let push_outstanding = families.gauge(
            "push_outstanding",
            "A push subscription's pushes sent and not answered yet",
            None,
        );
        let push_failures = families.gauge(
            "push_failures_in_a_row",
            "A push subscription's pushes that did not acknowledge since the last one that did (0 while its endpoint acknowledges)",
            None,
        );
        let push_requests = families.counter(
            "push_subscription_requests",
            "A push subscription's pushes by outcome: the status's class (2xx acknowledges), connection_error or timeout, since its push task started",
            None,
        );
        SubscriptionFamilies {
            push_window,
            push_outstanding,
            push_failures,
            push_requests,
            backlog_bytes,
            redelivered,
            acknowledged,
            dead_lettered,
            open_streams,
            undelivered,
            oldest,
            outstanding,
            delivered,
            expired,
        }
    }

    fn set(&self, topic: &TopicStats, subscription: &SubscriptionStats) {
        let labels = topic_labels(topic, vec![("subscription", subscription.name.clone())]);
        self.undelivered.get_or_create(&labels).set(subscription.backlog_messages as f64);
        self.oldest.get_or_create(&labels).set(subscription.oldest_unacked_age_ms as f64 / 1e3);
        self.outstanding.get_or_create(&labels).set(subscription.outstanding_messages as f64);
        self.delivered.get_or_create(&labels).inc_by(subscription.delivered_total);
        self.expired.get_or_create(&labels).inc_by(subscription.expired_total);
        self.backlog_bytes.get_or_create(&labels).set(subscription.backlog_bytes as f64);
        self.redelivered.get_or_create(&labels).inc_by(subscription.redelivered_total);
        self.acknowledged.get_or_create(&labels).inc_by(subscription.acked_total);
        self.dead_lettered.get_or_create(&labels).inc_by(subscription.dead_lettered_total);
        self.open_streams.get_or_create(&labels).set(subscription.open_streams as f64);
        if let Some(push) = &subscription.push {
            self.push_window.get_or_create(&labels).set(push.window as f64);
            self.push_outstanding.get_or_create(&labels).set(push.outstanding as f64);
            self.push_failures.get_or_create(&labels).set(push.failures_in_a_row as f64);
            for (class, count) in &push.requests_by_class {
                let mut labels = labels.clone();
                labels.push(("class", class.clone()));
                self.push_requests.get_or_create(&labels).inc_by(*count);
            }
        }
    }
}

/// The families of a replicated topic's figures on this node.
struct ReplicaFamilies {
    replica_leader: Family<Labels, FloatGauge>,
    replica_epoch: Family<Labels, FloatGauge>,
    replica_committed: Family<Labels, FloatGauge>,
    follower_lag: Family<Labels, FloatGauge>,
}

impl ReplicaFamilies {
    fn register(families: &mut Families) -> ReplicaFamilies {
        let replica_leader = families.gauge(
            "replica_leader",
            "1 when this node's replica of a replicated topic leads it, else 0",
            None,
        );
        let replica_epoch = families.gauge(
            "replica_epoch",
            "The leader epoch this node's replica leads or last synced with",
            None,
        );
        let replica_committed = families.gauge(
            "replica_committed_end",
            "One past the last message a quorum of the topic's replicas holds",
            None,
        );
        let follower_lag = families.gauge(
            "replica_follower_lag_messages",
            "On a leader: messages durable on it that a follower does not hold yet",
            None,
        );
        ReplicaFamilies { replica_leader, replica_epoch, replica_committed, follower_lag }
    }

    fn set(&self, topic: &TopicStats, replica: &ReplicaStats) {
        let labels = topic_labels(topic, Vec::new());
        self.replica_leader.get_or_create(&labels).set(if replica.leader { 1.0 } else { 0.0 });
        self.replica_epoch.get_or_create(&labels).set(replica.epoch as f64);
        self.replica_committed.get_or_create(&labels).set(replica.committed_end as f64);
        for follower in &replica.followers {
            // The node and its forwarder, as an operator names them, not the packed shard.
            let (node, forwarder) = crate::catalog::node_and_shard(follower.shard);
            let mut labels = topic_labels(topic, Vec::new());
            labels
                .extend([("follower_node", node.to_string()), ("follower_forwarder", forwarder.to_string())]);
            self.follower_lag.get_or_create(&labels).set(follower.lag_messages as f64);
        }
    }
}

/// The catalog's group as this node sees it: term, leader, this node, members and, on the
/// leader, when each was last heard.
fn encode_cluster(families: &mut Families, cluster: &ClusterStatus) {
    families
        .gauge("catalog_term", "The catalog's raft term as this node knows it", None)
        .get_or_create(&Vec::new())
        .set(cluster.term as f64);
    families
        .gauge(
            "catalog_leader_node",
            "The node leading the catalog as this node can vouch for it; 0 during an election, on a leader \
             not heard by a majority of its voters for 2 s, and on a node that has not heard its leader for 2 s",
            None,
        )
        .get_or_create(&Vec::new())
        .set(cluster.catalog_leader.map_or(0, NodeId::get) as f64);
    families
        .gauge("node_id", "This node's id in the cluster", None)
        .get_or_create(&Vec::new())
        .set(cluster.node_id.get() as f64);
    let members = families.gauge("catalog_members", "Members of the catalog's group, by kind", None);
    let voters = cluster.nodes.iter().filter(|node| node.voter).count();
    members.get_or_create(&vec![("kind", "voter".to_owned())]).set(voters as f64);
    members.get_or_create(&vec![("kind", "learner".to_owned())]).set((cluster.nodes.len() - voters) as f64);
    // Only the leader hears every member; elsewhere the family is empty.
    let heard = families.gauge(
        "catalog_member_last_heard_seconds",
        "On the catalog's leader: seconds since each member last answered it (0 for itself)",
        None,
    );
    for node in &cluster.nodes {
        if let Some(ago) = node.heard_ms_ago {
            heard.get_or_create(&vec![("node", node.node_id.to_string())]).set(ago as f64 / 1000.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::cluster::NodeStatus;
    use crate::api::stats::{SubscriptionStats, TopicStats};

    fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn topics_past_the_limit_are_counted_not_shown_and_the_cluster_is_shown() {
        let topics: Vec<TopicStats> = (0..METRICS_TOPICS_MAX + 3)
            .map(|index| TopicStats {
                name: format!("topic-{index:05}"),
                end_offset: index as u64,
                subscriptions: vec![SubscriptionStats {
                    name: format!("sub-{index:05}"),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        let stats = Stats { topics, ..Default::default() };
        let cluster = ClusterStatus {
            node_id: NodeId::new(2),
            catalog_leader: Some(NodeId::new(3)),
            term: 7,
            nodes: (1..=4)
                .map(|node_id| NodeStatus {
                    node_id: NodeId::new(node_id),
                    voter: node_id != 4,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let text = encode_metrics(&stats, Some(&cluster), &Counted::default(), "9.9.9");
        assert!(text.ends_with("# EOF\n"), "{}", &text[text.len() - 100..]);
        assert_eq!(text.matches("# EOF").count(), 1);
        assert_eq!(sample(&text, "ringpost_metrics_topics_omitted"), Some("3.0"));
        assert_eq!(sample(&text, "ringpost_metrics_subscriptions_omitted"), Some("3.0"));
        assert_eq!(sample(&text, "ringpost_topic_offsets_total{topic=\"topic-00999\"}"), Some("999"));
        assert_eq!(sample(&text, "ringpost_topic_offsets_total{topic=\"topic-01000\"}"), None);
        assert_eq!(sample(&text, "ringpost_catalog_leader_node"), Some("3.0"));
        assert_eq!(sample(&text, "ringpost_catalog_term"), Some("7.0"));
        assert_eq!(sample(&text, "ringpost_catalog_members{kind=\"learner\"}"), Some("1.0"));
        assert_eq!(sample(&text, "ringpost_build_info{version=\"9.9.9\"}"), Some("1.0"));
        // Each family is declared once.
        let mut declared: Vec<&str> = text.lines().filter(|line| line.starts_with("# TYPE ")).collect();
        let count = declared.len();
        declared.sort_unstable();
        declared.dedup();
        assert_eq!(declared.len(), count);
    }

    #[test]
    fn a_push_subscription_has_its_window_outstanding_failures_and_pushes_by_class() {
        let push = crate::api::stats::PushStats {
            endpoint: "https://receiver.example/push".to_owned(),
            window: 12,
            outstanding: 3,
            failures_in_a_row: 2,
            requests_by_class: vec![("2xx".to_owned(), 40), ("5xx".to_owned(), 2)],
            ..Default::default()
        };
        let topic = TopicStats {
            name: "orders".to_owned(),
            subscriptions: vec![
                SubscriptionStats { name: "pushed".to_owned(), push: Some(push), ..Default::default() },
                SubscriptionStats { name: "pulled".to_owned(), ..Default::default() },
            ],
            ..Default::default()
        };
        let stats = Stats { topics: vec![topic], ..Default::default() };
        let text = encode_metrics(&stats, None, &Counted::default(), "1");
        let labels = r#"{subscription="pushed",topic="orders"}"#;
        assert_eq!(sample(&text, &format!("ringpost_push_window{labels}")), Some("12.0"), "{text}");
        assert_eq!(sample(&text, &format!("ringpost_push_outstanding{labels}")), Some("3.0"));
        assert_eq!(sample(&text, &format!("ringpost_push_failures_in_a_row{labels}")), Some("2.0"));
        let requests =
            r#"ringpost_push_subscription_requests_total{subscription="pushed",topic="orders",class="5xx"}"#;
        assert_eq!(sample(&text, requests), Some("2"));
        // A pull subscription has none.
        assert!(!text.contains(r#"ringpost_push_window{subscription="pulled""#));
    }

    #[test]
    fn a_topic_of_several_sources_has_a_series_per_source() {
        let unit = |source: u32, several_sources: bool, published: u64| TopicStats {
            name: if several_sources { "hot" } else { "calm" }.to_owned(),
            source: crate::ids::SourceId::new(source).unwrap(),
            several_sources,
            published_messages_total: published,
            subscriptions: vec![SubscriptionStats {
                name: format!("watch-{source}"),
                delivered_total: published,
                ..Default::default()
            }],
            ..Default::default()
        };
        let stats = Stats {
            topics: vec![unit(0, false, 4), unit(0, true, 5), unit(1, true, 7)],
            ..Default::default()
        };
        let text = encode_metrics(&stats, None, &Counted::default(), "1");
        let published =
            |labels: &str| sample(&text, &format!("ringpost_topic_published_messages_total{{{labels}}}"));
        assert_eq!(published(r#"topic="hot",source="0""#), Some("5"), "{text}");
        assert_eq!(published(r#"topic="hot",source="1""#), Some("7"));
        assert_eq!(published(r#"topic="calm""#), Some("4"), "a topic of one source keeps its labels");
        let delivered = r#"ringpost_subscription_delivered_messages_total{subscription="watch-1",topic="hot",source="1"}"#;
        assert_eq!(sample(&text, delivered), Some("7"));
    }

    #[test]
    fn a_followed_topic_shows_its_sources_bounds_and_last_decision() {
        use crate::router::follow::{Decision, FollowedTopic};
        let bounds = crate::catalog::SourceBounds { min: 1, max: 4 };
        let counted = Counted {
            followed: vec![
                FollowedTopic { name: "hot".into(), sources: 3, bounds, last_decision: Some(Decision::Add) },
                FollowedTopic { name: "new".into(), sources: 1, bounds, last_decision: None },
            ],
            ..Default::default()
        };
        let text = encode_metrics(&Stats::default(), None, &counted, "1");
        assert_eq!(sample(&text, r#"ringpost_topic_sources{topic="hot"}"#), Some("3.0"), "{text}");
        assert_eq!(sample(&text, r#"ringpost_topic_sources_max{topic="hot"}"#), Some("4.0"));
        assert_eq!(sample(&text, r#"ringpost_topic_sources_min{topic="new"}"#), Some("1.0"));
        let added = r#"ringpost_topic_sources_last_decision{topic="hot",decision="add"}"#;
        assert_eq!(sample(&text, added), Some("1.0"));
        assert!(!text.contains(r#"ringpost_topic_sources_last_decision{topic="new""#));
    }

    #[test]
    fn label_values_are_escaped() {
        let topic = TopicStats { name: "a\"b\\c".to_owned(), ..Default::default() };
        let text = encode_metrics(
            &Stats { topics: vec![topic], ..Default::default() },
            None,
            &Counted::default(),
            "1",
        );
        assert!(text.contains(r#"ringpost_topic_offsets_total{topic="a\"b\\c"} 0"#), "{text}");
        assert!(!text.contains("ringpost_catalog_term"));
    }
}
