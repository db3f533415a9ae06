//! The outcome of a run: the table for people, the JSON for scripts, and the latency plot.

use super::format::{json_number, thousands};
use super::latency::{self, QUANTILES};
use super::plot::{self, Series};
use super::publish::DURABILITY;
use super::workload::{Workload, WorkloadOptions};
use crate::json;
use hdrhistogram::Histogram;
use ringpost_wire::messages::LatencySummary;

/// Threads whose CPU time the table shows (the JSON has them all).
pub const THREADS_SHOWN_MAX: usize = 8;

/// What the subscribers saw, for workloads that have them.
#[derive(Debug, Clone)]
pub struct DeliveryReport {
    /// First deliveries, summed over subscriptions: each (subscription, message) once.
    pub delivered: u64,
    /// Deliveries of a message the subscription had already received.
    pub duplicates: u64,
    /// Acknowledged publishes never delivered, summed over subscriptions; must be 0.
    pub lost: u64,
    /// Deliveries of ids no publish was acknowledged with (a publish that failed but was
    /// stored after all, or a server bug).
    pub unexpected: u64,
    /// From the first publish (or, for the backlog, from opening the streams) to the last first
    /// delivery.
    pub seconds: f64,
    /// Delivery latency of each first delivery, from its publish start.
    pub latency_us: Histogram<u64>,
    pub acknowledged: u64,
    pub acknowledge_failed: u64,
    /// Some subscriber gave up waiting for messages that never came.
    pub timed_out: bool,
    pub first_error: Option<String>,
}

impl DeliveryReport {
    pub fn deliveries_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.delivered as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// The daemon's resident memory (RSS) around a run, from its stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    /// Before the run's topics and subscriptions were created.
    pub before_bytes: u64,
    /// Once they were created, before anything was published: what the idle topics cost.
    pub idle_bytes: u64,
    /// After the run, before its topics were deleted.
    pub after_bytes: u64,
}

impl Resident {
    /// Resident bytes the run's idle topics (each with its subscriptions) added, per topic.
    pub fn idle_bytes_per_topic(&self, topics: usize) -> u64 {
        self.idle_bytes.saturating_sub(self.before_bytes) / topics.max(1) as u64
    }
}

/// One forwarder shard's own latencies over the last 10-20 s of a run, from its stats: the
/// shard's share of the publish-ack latency (publish) and the disk's (commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLatency {
    pub shard: u32,
    pub publish: LatencySummary,
    pub commit: LatencySummary,
}

/// A shard's latency summary as a JSON object (microseconds): here and in `ringpost stats`.
pub fn summary_json(summary: &LatencySummary) -> String {
    json::object(&[
        ("count", summary.count.to_string()),
        ("p50", summary.p50_us.to_string()),
        ("p99", summary.p99_us.to_string()),
        ("p999", summary.p999_us.to_string()),
        ("max", summary.max_us.to_string()),
    ])
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The topic published to, or a description of the topics.
    pub topic: String,
    /// Seconds spent creating the topics and subscriptions.
    pub setup_seconds: f64,
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
    pub delivery: Option<DeliveryReport>,
    /// Problems that do not invalidate the figures, such as a topic that could not be deleted.
    pub warnings: Vec<String>,
    /// None when the daemon's stats could not be read.
    pub resident: Option<Resident>,
    /// Backlog workload: resident bytes with the backlog stored, before it is drained.
    pub resident_stored_bytes: Option<u64>,
    /// Topics workload: how many forwarder shards serve its topics (the router places them by
    /// hash within bounded loads, so a few topics may share one). None where not looked up.
    pub forwarders: Option<usize>,
    /// The forwarder shards that served publishes, as their stats measured them at the end of
    /// the run; empty when the stats could not be read.
    pub server_latency: Vec<ShardLatency>,
    /// CPU seconds of this process's threads over the run, by name, most first (with
    /// `--embedded`, the daemon's threads among them); threads that ended before its end are
    /// not counted.
    pub threads_cpu: Vec<(String, f64)>,
}

impl Report {
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

    /// Everything that makes the run a failure, one sentence each: failed publishes, lost
    /// messages, failed acknowledgements, broken streams.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.messages_failed > 0 {
            problems.push(format!(
                "{} of {} messages failed to publish; the first error: {}",
                thousands(self.messages_failed),
                thousands(self.messages()),
                self.first_error.as_deref().unwrap_or("unknown")
            ));
        }
        if let Some(delivery) = &self.delivery {
            if delivery.lost > 0 {
                problems.push(format!(
                    "{} acknowledged messages were never delivered (lost){}",
                    thousands(delivery.lost),
                    if delivery.timed_out { "; a subscriber gave up waiting for them" } else { "" }
                ));
            }
            if delivery.acknowledge_failed > 0 {
                problems.push(format!("{} acknowledgements failed", thousands(delivery.acknowledge_failed)));
            }
            if let Some(error) = &delivery.first_error {
                problems.push(format!("a subscriber reported: {error}"));
            }
        }
        problems
    }

    /// The results table for stdout.
    pub fn table(&self, options: &WorkloadOptions) -> String {
        let publish = &options.publish;
        let mut rows: Vec<(String, String)> = vec![
            ("messages".into(), thousands(self.messages())),
            ("requests".into(), thousands(self.requests)),
            ("seconds".into(), format!("{:.3}", self.seconds)),
            ("msgs/s".into(), thousands(self.messages_per_sec().round() as u64)),
            ("MB/s".into(), format!("{:.1}", self.mb_per_sec(publish.size_bytes))),
        ];
        for (name, _, quantile) in QUANTILES {
            rows.push((format!("latency {name} us"), thousands(latency::at(&self.latency_us, quantile))));
        }
        rows.push(("latency max us".into(), thousands(self.latency_us.max())));
        if publish.rate_per_sec.is_some() {
            rows.push(("send lag max us".into(), thousands(self.send_lag_us_max)));
        }
        rows.push(("errors".into(), thousands(self.messages_failed)));
        for shard in &self.server_latency {
            let pair = |summary: &LatencySummary| {
                format!("{} / {}", thousands(summary.p50_us), thousands(summary.p99_us))
            };
            rows.push((format!("shard {} publish p50/p99 us", shard.shard), pair(&shard.publish)));
            rows.push((format!("shard {} commit p50/p99 us", shard.shard), pair(&shard.commit)));
        }
        if let Some(delivery) = &self.delivery {
            rows.push(("setup seconds".into(), format!("{:.3}", self.setup_seconds)));
            if let Some(resident) = &self.resident {
                let mib = |bytes: u64| format!("{:.1}", bytes as f64 / (1024.0 * 1024.0));
                rows.push(("resident MiB before".into(), mib(resident.before_bytes)));
                rows.push(("resident MiB idle".into(), mib(resident.idle_bytes)));
                if let Some(stored) = self.resident_stored_bytes {
                    rows.push(("resident MiB stored".into(), mib(stored)));
                }
                rows.push(("resident MiB after".into(), mib(resident.after_bytes)));
                // Per topic only where there are many: one topic's share is all noise.
                if options.workload == Workload::Topics {
                    rows.push((
                        "resident/idle topic".into(),
                        format!("{} B", thousands(resident.idle_bytes_per_topic(options.topic_count()))),
                    ));
                }
            }
            rows.push(("delivered".into(), thousands(delivery.delivered)));
            rows.push(("delivery seconds".into(), format!("{:.3}", delivery.seconds)));
            rows.push(("deliveries/s".into(), thousands(delivery.deliveries_per_sec().round() as u64)));
            for (name, _, quantile) in QUANTILES {
                rows.push((format!("e2e {name} us"), thousands(latency::at(&delivery.latency_us, quantile))));
            }
            rows.push(("e2e max us".into(), thousands(delivery.latency_us.max())));
            rows.push(("lost".into(), thousands(delivery.lost)));
            rows.push(("duplicates".into(), thousands(delivery.duplicates)));
            rows.push(("unexpected".into(), thousands(delivery.unexpected)));
            rows.push(("ack errors".into(), thousands(delivery.acknowledge_failed)));
        }
        for (name, seconds) in self.threads_cpu.iter().take(THREADS_SHOWN_MAX) {
            rows.push((format!("cpu s {name}"), format!("{seconds:.2}")));
        }
        let loop_kind = match publish.rate_per_sec {
            Some(rate) => format!(
                "open loop at {} msg/s offered; latency counts from each request's scheduled send time",
                thousands(rate.round() as u64)
            ),
            None => "closed loop".to_owned(),
        };
        let mut out = format!(
            "{} to {}: {} messages of {} bytes, {} publishers, batch {}, {} requests in flight each, {loop_kind}\n",
            options.workload.name(),
            self.topic,
            thousands(publish.messages),
            thousands(publish.size_bytes as u64),
            publish.publishers,
            publish.batch,
            publish.inflight,
        );
        if options.workload == Workload::Push {
            out.push_str(
                "  1 subscription pushed by the daemon to a receiver in this process answering 204 (one thread, HTTP/1.1)\n",
            );
        } else if options.workload.has_subscribers() {
            let count = |number: usize, noun: &str| {
                format!("{} {noun}{}", thousands(number as u64), if number == 1 { "" } else { "s" })
            };
            out.push_str(&format!(
                "  {} on {}, {}, streaming pull with a window of {} messages\n",
                count(options.subscription_count(), "subscription"),
                count(options.topic_count(), "topic"),
                count(options.subscriber_threads.min(options.subscription_count()), "subscriber thread"),
                thousands(options.window),
            ));
        }
        let name_width = rows.iter().map(|(name, _)| name.len() + 1).max().unwrap_or(0).max(18);
        let value_width = rows.iter().map(|(_, value)| value.len()).max().unwrap_or(0);
        for (name, value) in rows {
            out.push_str(&format!("  {name:<name_width$}{value:>value_width$}\n"));
        }
        let origin = if publish.rate_per_sec.is_some() { "its scheduled send time" } else { "its send" };
        out.push_str(&format!(
            "  publish-ack latency is per request, from {origin} to the durable acknowledgement\n"
        ));
        if !self.server_latency.is_empty() {
            out.push_str(
                "  shard latencies are the daemon's own, over its last 10-20 s: publish from the validated request to its durable result, commit from the write issued to durable\n",
            );
        }
        if self.delivery.is_some() {
            let origin = if publish.rate_per_sec.is_some() { "scheduled send time" } else { "publish start" };
            out.push_str(&format!(
                "  e2e latency is per message, from its {origin} to its receipt by a subscriber\n"
            ));
            if options.workload == Workload::Backlog {
                out.push_str("  deliveries/s is the drain rate: the stored backlog from opening the stream to the last message\n");
            }
        }
        out.push_str(&format!("  durability: {DURABILITY}\n"));
        out
    }

    /// One JSON object: the publish figures (`workload` ... `errors`), then for workloads with
    /// subscribers the delivery figures (`e2e_us`, `delivered`, `lost`, `duplicates`, ...).
    pub fn json(&self, options: &WorkloadOptions) -> String {
        let publish = &options.publish;
        let mut fields: Vec<(&str, String)> = vec![
            ("workload", json::string(options.workload.name())),
            ("messages", self.messages().to_string()),
            ("size", publish.size_bytes.to_string()),
            ("publishers", publish.publishers.to_string()),
            ("batch", publish.batch.to_string()),
            ("inflight", publish.inflight.to_string()),
            ("rate", publish.rate_per_sec.map(|rate| json_number(rate, 1)).unwrap_or_else(|| "null".into())),
            ("seconds", json_number(self.seconds, 3)),
            ("msgs_per_sec", json_number(self.messages_per_sec(), 1)),
            ("mb_per_sec", json_number(self.mb_per_sec(publish.size_bytes), 3)),
            ("publish_ack_us", latency::json(&self.latency_us)),
            ("errors", self.messages_failed.to_string()),
        ];
        if let Some(delivery) = &self.delivery {
            fields.extend([
                ("topics", options.topic_count().to_string()),
                ("subscriptions", options.subscription_count().to_string()),
                ("window", options.window.to_string()),
                ("setup_seconds", json_number(self.setup_seconds, 3)),
                (
                    "resident_before_bytes",
                    self.resident.map_or("null".into(), |resident| resident.before_bytes.to_string()),
                ),
                (
                    "resident_idle_bytes",
                    self.resident.map_or("null".into(), |resident| resident.idle_bytes.to_string()),
                ),
                (
                    "resident_stored_bytes",
                    self.resident_stored_bytes.map_or("null".into(), |bytes| bytes.to_string()),
                ),
                (
                    "resident_after_bytes",
                    self.resident.map_or("null".into(), |resident| resident.after_bytes.to_string()),
                ),
                (
                    "resident_per_idle_topic_bytes",
                    self.resident.map_or("null".into(), |resident| {
                        resident.idle_bytes_per_topic(options.topic_count()).to_string()
                    }),
                ),
                ("delivered", delivery.delivered.to_string()),
                ("delivery_seconds", json_number(delivery.seconds, 3)),
                ("deliveries_per_sec", json_number(delivery.deliveries_per_sec(), 1)),
                ("e2e_us", latency::json(&delivery.latency_us)),
                ("lost", delivery.lost.to_string()),
                ("duplicates", delivery.duplicates.to_string()),
                ("unexpected", delivery.unexpected.to_string()),
                ("ack_errors", delivery.acknowledge_failed.to_string()),
            ]);
        }
        if let Some(forwarders) = self.forwarders {
            fields.push(("forwarders", forwarders.to_string()));
        }
        let shards: Vec<String> = self
            .server_latency
            .iter()
            .map(|shard| {
                json::object(&[
                    ("shard", shard.shard.to_string()),
                    ("publish_us", summary_json(&shard.publish)),
                    ("commit_us", summary_json(&shard.commit)),
                ])
            })
            .collect();
        if !shards.is_empty() {
            fields.push(("server_latency", format!("[{}]", shards.join(","))));
        }
        if !self.threads_cpu.is_empty() {
            let threads: Vec<(&str, String)> = self
                .threads_cpu
                .iter()
                .map(|(name, seconds)| (name.as_str(), json_number(*seconds, 2)))
                .collect();
            fields.push(("cpu_seconds", json::object(&threads)));
        }
        json::object(&fields)
    }

    /// The percentile plot of publish-ack and, with subscribers, delivery latency.
    pub fn latency_svg(&self, options: &WorkloadOptions) -> String {
        let publish = &options.publish;
        let title = format!(
            "ringpost-bench {}: {} x {} B, {} publishers, batch {}, {}",
            options.workload.name(),
            thousands(publish.messages),
            thousands(publish.size_bytes as u64),
            publish.publishers,
            publish.batch,
            match publish.rate_per_sec {
                Some(rate) => format!("open loop {} msg/s", thousands(rate.round() as u64)),
                None => format!("closed loop, {} in flight", publish.inflight),
            }
        );
        let mut series =
            vec![Series { name: "publish-ack latency (per request)", latency_us: &self.latency_us }];
        if let Some(delivery) = &self.delivery {
            series.push(Series {
                name: "e2e delivery latency (per message)",
                latency_us: &delivery.latency_us,
            });
        }
        plot::svg(&title, &series)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::latency::new_histogram;
    use crate::bench::publish::PublishOptions;

    fn options(workload: Workload) -> WorkloadOptions {
        WorkloadOptions::new(workload, PublishOptions::default())
    }

    fn report() -> Report {
        let mut latency_us = new_histogram();
        latency_us.record(1000).unwrap();
        Report {
            topic: "bench".into(),
            setup_seconds: 0.5,
            messages_acknowledged: 200,
            messages_failed: 0,
            requests: 2,
            seconds: 2.0,
            latency_us,
            send_lag_us_max: 0,
            first_error: None,
            delivery: None,
            warnings: Vec::new(),
            resident: None,
            resident_stored_bytes: None,
            forwarders: None,
            server_latency: Vec::new(),
            threads_cpu: Vec::new(),
        }
    }

    #[test]
    fn publish_json_keeps_its_keys() {
        assert_eq!(
            report().json(&options(Workload::Publish)),
            concat!(
                "{\"workload\":\"publish\",\"messages\":200,\"size\":1024,\"publishers\":4,\"batch\":100,",
                "\"inflight\":8,\"rate\":null,\"seconds\":2.000,\"msgs_per_sec\":100.0,\"mb_per_sec\":0.102,",
                "\"publish_ack_us\":{\"p50\":1000,\"p90\":1000,\"p99\":1000,\"p999\":1000,\"max\":1000},",
                "\"errors\":0}"
            )
        );
        assert!(report().table(&options(Workload::Publish)).contains(DURABILITY));
        assert!(report().problems().is_empty());
    }

    #[test]
    fn the_shards_own_latencies_are_reported_beside_the_clients() {
        let mut report = report();
        let summary =
            |p50_us, p99_us| LatencySummary { count: 10, p50_us, p99_us, p999_us: p99_us, max_us: p99_us };
        report.server_latency =
            vec![ShardLatency { shard: 1, publish: summary(220, 700), commit: summary(170, 400) }];
        let options = options(Workload::Publish);
        let json = report.json(&options);
        assert!(
            json.ends_with(concat!(
                "\"server_latency\":[{\"shard\":1,",
                "\"publish_us\":{\"count\":10,\"p50\":220,\"p99\":700,\"p999\":700,\"max\":700},",
                "\"commit_us\":{\"count\":10,\"p50\":170,\"p99\":400,\"p999\":400,\"max\":400}}]}"
            )),
            "{json}"
        );
        let table = report.table(&options);
        assert!(table.contains("shard 1 publish p50/p99 us 220 / 700"), "{table}");
        assert!(table.contains("shard 1 commit p50/p99 us  170 / 400"), "{table}");
    }

    #[test]
    fn delivery_json_adds_the_delivery_keys() {
        let mut e2e = new_histogram();
        e2e.record(2000).unwrap();
        let mut report = report();
        report.delivery = Some(DeliveryReport {
            delivered: 200,
            duplicates: 1,
            lost: 0,
            unexpected: 0,
            seconds: 4.0,
            latency_us: e2e,
            acknowledged: 201,
            acknowledge_failed: 0,
            timed_out: false,
            first_error: None,
        });
        let options = options(Workload::EndToEnd);
        let json = report.json(&options);
        let parsed = crate::json::parse(&json).unwrap().flatten();
        let keys: Vec<&str> = parsed.iter().map(|(key, _)| key.as_str()).collect();
        for key in [
            "msgs_per_sec",
            "publish_ack_us.p99",
            "e2e_us.p50",
            "e2e_us.p99",
            "e2e_us.p999",
            "delivered",
            "lost",
            "duplicates",
        ] {
            assert!(keys.contains(&key), "{key} missing from {json}");
        }
        assert!(json.contains("\"deliveries_per_sec\":50.0"), "{json}");
        assert!(report.table(&options).contains("e2e p99 us"));
        assert!(report.problems().is_empty());
        report.delivery.as_mut().unwrap().lost = 3;
        assert_eq!(report.problems().len(), 1);
        assert!(report.latency_svg(&options).contains("e2e delivery latency"));

        assert!(json.contains("\"resident_per_idle_topic_bytes\":null"), "unknown, not zero: {json}");
        report.resident =
            Some(Resident { before_bytes: 1 << 20, idle_bytes: (1 << 20) + 3000, after_bytes: 2 << 20 });
        let mut topics =
            crate::bench::workload::WorkloadOptions::new(Workload::Topics, PublishOptions::default());
        topics.topics = 2;
        assert_eq!(report.resident.unwrap().idle_bytes_per_topic(topics.topic_count()), 1500);
        assert!(report.json(&topics).contains("\"resident_per_idle_topic_bytes\":1500"));
        assert!(report.table(&topics).contains("resident/idle topic"));
        assert!(!report.json(&topics).contains("forwarders"), "not looked up, not reported");
        report.forwarders = Some(2);
        assert!(report.json(&topics).contains("\"forwarders\":2"));
    }
}
