//! `ringpost probe`: the prober of the system Ringpost follows. Each probe creates a
//! subscription of its own on the probe topic, publishes one message, and times three things
//! a user feels: creating the subscription, the publish's acknowledgement, and the message's
//! delivery (from the publish's start to the pull that brings it); then it acknowledges and
//! deletes the subscription. Each probe is one JSON line; a probe that fails or misses an
//! objective makes the command exit non-zero at the end. With `--http-listen`, its figures are
//! served to Prometheus as histograms and counters while it runs.

use crate::json;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use ringpost_client::{Client, ErrorCode, Message, Subscription};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The probe topic unless `--topic` names another.
pub const PROBE_TOPIC_DEFAULT: &str = "ringpost-probe";
/// Objectives unless given: a publish acknowledged within 1 s, the message delivered within
/// 5 s of the publish's start, a subscription created within 2 s.
pub const PUBLISH_OBJECTIVE_MS_DEFAULT: u64 = 1_000;
pub const DELIVERY_OBJECTIVE_MS_DEFAULT: u64 = 5_000;
pub const CREATE_OBJECTIVE_MS_DEFAULT: u64 = 2_000;
/// How long a probe waits for its message before it counts as lost: the delivery objective
/// or this, whichever is longer.
const DELIVERY_WAIT_MIN: Duration = Duration::from_secs(10);
/// The ack deadline of a probe's subscription: long enough that its message is not
/// delivered twice while the probe acknowledges it.
const PROBE_ACK_DEADLINE_SECONDS: u32 = 10;
/// The most of a request's head the probe's endpoint reads (it serves one connection at a
/// time: a scrape is small and rare).
const SCRAPE_REQUEST_BYTES_MAX: usize = 8 * 1024;
/// Messages one of the probe's pulls takes (its own, and other probers' on the same topic).
const PROBE_PULL_MESSAGES_MAX: u32 = 100;
/// The longest a probe's pull waits, so that a lost message is noticed near its deadline.
const PROBE_PULL_WAIT_MS_MAX: u32 = 1_000;

#[derive(Debug, Clone, Copy)]
pub struct Objectives {
    pub create_subscription: Duration,
    pub publish_ack: Duration,
    pub delivery: Duration,
}

/// What one probe measured.
#[derive(Debug, Clone, Default)]
pub struct ProbeResult {
    pub create_subscription: Option<Duration>,
    pub publish_ack: Option<Duration>,
    pub delivery: Option<Duration>,
    /// Why the probe failed, if it did.
    pub error: Option<String>,
    /// Objectives missed, by name.
    pub missed: Vec<&'static str>,
}

impl ProbeResult {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.missed.is_empty()
    }

    /// One JSON line.
    pub fn json(&self, sequence: u64) -> String {
        let ms = |duration: Option<Duration>| {
            duration.map_or("null".to_owned(), |duration| format!("{:.3}", duration.as_secs_f64() * 1e3))
        };
        let time_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis());
        json::object(&[
            ("probe", sequence.to_string()),
            ("time_ms", time_ms.to_string()),
            ("ok", self.ok().to_string()),
            ("create_subscription_ms", ms(self.create_subscription)),
            ("publish_ack_ms", ms(self.publish_ack)),
            ("delivery_ms", ms(self.delivery)),
            (
                "missed",
                format!(
                    "[{}]",
                    self.missed.iter().map(|name| json::string(name)).collect::<Vec<_>>().join(",")
                ),
            ),
            ("error", self.error.as_deref().map_or("null".to_owned(), json::string)),
        ])
    }
}

/// Makes the probe topic if it is not there.
pub async fn ensure_topic(client: &Client, topic: &str) -> Result<(), ringpost_client::Error> {
    match client.create_topic(topic).await {
        Ok(_) => Ok(()),
        Err(error) if error.code() == ErrorCode::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

/// One probe on `topic`, its subscription named after `label`.
pub async fn probe(client: &Client, topic: &str, label: &str, objectives: &Objectives) -> ProbeResult {
    let mut result = ProbeResult::default();
    let subscription = format!("{topic}-{label}");
    let started = Instant::now();
    let created = client
        .create_subscription(Subscription {
            name: subscription.clone(),
            topic: topic.to_owned(),
            ack_deadline_seconds: PROBE_ACK_DEADLINE_SECONDS,
            ..Default::default()
        })
        .await;
    if let Err(error) = created {
        result.error = Some(format!("creating subscription {subscription}: {error}"));
        return result;
    }
    result.create_subscription = Some(started.elapsed());
    let outcome = publish_and_receive(client, topic, &subscription, label, objectives, &mut result).await;
    if let Err(error) = outcome {
        result.error = Some(error);
    }
    // What the probe made goes whatever happened; a failure to delete is the probe's failure.
    if let Err(error) = client.delete_subscription(&subscription).await {
        result.error.get_or_insert(format!("deleting subscription {subscription}: {error}"));
    }
    for (name, measured, objective) in [
        ("create_subscription", result.create_subscription, objectives.create_subscription),
        ("publish_ack", result.publish_ack, objectives.publish_ack),
        ("delivery", result.delivery, objectives.delivery),
    ] {
        if measured.is_some_and(|measured| measured > objective) {
            result.missed.push(name);
        }
    }
    result
}

async fn publish_and_receive(
    client: &Client,
    topic: &str,
    subscription: &str,
    label: &str,
    objectives: &Objectives,
    result: &mut ProbeResult,
) -> Result<(), String> {
    let payload = format!("probe {label}");
    let started = Instant::now();
    client
        .publish(topic, vec![Message::new(payload.as_str())])
        .await
        .map_err(|error| format!("publishing to {topic}: {error}"))?;
    result.publish_ack = Some(started.elapsed());
    let wait = objectives.delivery.max(DELIVERY_WAIT_MIN);
    loop {
        let left = wait.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(format!("the probe's message was not delivered within {wait:?}"));
        }
        let wait_ms = left.as_millis().min(PROBE_PULL_WAIT_MS_MAX.into()) as u32;
        let messages = client
            .pull(subscription, PROBE_PULL_MESSAGES_MAX, wait_ms.max(1))
            .await
            .map_err(|error| format!("pulling {subscription}: {error}"))?;
        let received = Instant::now();
        // Other probers' messages on the same topic come too: acknowledged, not counted.
        let ours = messages.iter().any(|message| message.data == payload.as_bytes());
        let ack_ids: Vec<String> = messages.into_iter().map(|message| message.ack_id).collect();
        if !ack_ids.is_empty() {
            client
                .acknowledge(subscription, ack_ids)
                .await
                .map_err(|error| format!("acknowledging on {subscription}: {error}"))?;
        }
        if ours {
            result.delivery = Some(received - started);
            return Ok(());
        }
    }
}

/// The probe's own figures, served to Prometheus.
pub struct ProbeMetrics {
    registry: Registry,
    probes: Family<Vec<(&'static str, &'static str)>, Counter>,
    create_subscription: Histogram,
    publish_ack: Histogram,
    delivery: Histogram,
}

impl ProbeMetrics {
    pub fn new() -> ProbeMetrics {
        // From 1 ms to about 33 s, doubling.
        let buckets =
            || Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 16));
        let mut metrics = ProbeMetrics {
            registry: Registry::with_prefix("ringpost_probe"),
            probes: Family::default(),
            create_subscription: buckets(),
            publish_ack: buckets(),
            delivery: buckets(),
        };
        metrics.registry.register("probes", "Probes, by result (ok, missed, failed)", metrics.probes.clone());
        for (name, help, histogram) in [
            ("create_subscription", "Creating the probe's subscription", &metrics.create_subscription),
            ("publish_ack", "From a publish to its acknowledgement", &metrics.publish_ack),
            ("delivery", "From a publish's start to the pull that delivered it", &metrics.delivery),
        ] {
            metrics.registry.register_with_unit(name, help, Unit::Seconds, histogram.clone());
        }
        metrics
    }

    pub fn record(&self, result: &ProbeResult) {
        let outcome = match (&result.error, result.missed.is_empty()) {
            (Some(_), _) => "failed",
            (None, false) => "missed",
            (None, true) => "ok",
        };
        self.probes.get_or_create(&vec![("result", outcome)]).inc();
        for (histogram, measured) in [
            (&self.create_subscription, result.create_subscription),
            (&self.publish_ack, result.publish_ack),
            (&self.delivery, result.delivery),
        ] {
            if let Some(measured) = measured {
                histogram.observe(measured.as_secs_f64());
            }
        }
    }

    pub fn encode(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("encoding into a String cannot fail");
        text
    }
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        ProbeMetrics::new()
    }
}

/// Serves `GET /metrics` from `metrics` on `listener`, on a thread of its own, one request per
/// connection.
pub fn serve_metrics(listener: std::net::TcpListener, metrics: Arc<Mutex<ProbeMetrics>>) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|window| window == b"\r\n\r\n")
                && request.len() < SCRAPE_REQUEST_BYTES_MAX
            {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => request.extend_from_slice(&chunk[..read]),
                }
            }
            let head = String::from_utf8_lossy(&request);
            let (status, content_type, body) = if head.starts_with("GET /metrics ") {
                let body = metrics.lock().unwrap().encode();
                ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", body)
            } else {
                ("404 Not Found", "text/plain; charset=utf-8", "not found: /metrics\n".to_owned())
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}
