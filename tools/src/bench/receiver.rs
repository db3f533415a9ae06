//! The push workload's receiver: an HTTP/1.1 server in the benchmark's process, on a thread of
//! its own (hyper on a single-threaded tokio runtime, as one subscriber thread consumes W2),
//! that answers every push with 204 at once and records it as a subscriber thread records a
//! delivery: its message id against the acknowledged publishes, and its latency from the
//! publish start stamped in the payload to its receipt.
//!
//! Pushes arrive wrapped, as Pub/Sub sends them by default: a JSON envelope with the payload in
//! base64. Only the message id and the first bytes of the data (the stamp) are read out of it.

use super::gate::StartGate;
use super::ids::IdSet;
use super::latency::{instant_of_stamp, micros_between, new_histogram};
use super::live::LiveStats;
use super::publish::{read_stamp, STAMP_BYTES};
use super::subscribe::{SubscriberOutcome, DRAIN_IDLE_MAX, STOPPED_IDLE_MAX};
use super::Failure;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty, Limited};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of one push's body the receiver reads: a message of Pub/Sub's largest (10 MB) in
/// base64 with its envelope. A longer body is answered 413 and counted as an error.
pub const RECEIVER_BODY_BYTES_MAX: usize = 16 << 20;
/// How often the run's thread for the receiver copies its figures to the progress line and
/// looks whether every acknowledged message arrived.
const CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// What the receiver counted, shared by its connections and read by the run.
struct Tally {
    delivered: IdSet,
    deliveries: u64,
    duplicates: u64,
    latency_us: Histogram<u64>,
    /// Latencies since the run's thread last took them for the progress line.
    interval_latency_us: Histogram<u64>,
    /// Deliveries since the run's thread last took them.
    interval_deliveries: u64,
    last_delivery: Option<Instant>,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            delivered: IdSet::new(),
            deliveries: 0,
            duplicates: 0,
            latency_us: new_histogram(),
            interval_latency_us: new_histogram(),
            interval_deliveries: 0,
            last_delivery: None,
            first_error: None,
        }
    }

    fn record(&mut self, body: &[u8], received: Instant) {
        let Some((message_id, stamp)) = read_push(body) else {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            self.first_error.get_or_insert(format!("a push without a message id: {text}"));
            return;
        };
        self.deliveries += 1;
        self.interval_deliveries += 1;
        if !self.delivered.insert(message_id) {
            self.duplicates += 1;
            return;
        }
        self.last_delivery = Some(received);
        if let Some(stamp) = stamp {
            let latency = micros_between(instant_of_stamp(stamp), received);
            self.latency_us.saturating_record(latency);
            self.interval_latency_us.saturating_record(latency);
        }
    }
}

/// The receiver, serving on its thread until dropped.
pub struct PushReceiver {
    /// The URL the daemon is told to push to.
    pub endpoint: String,
    tally: Arc<Mutex<Tally>>,
    shutdown: Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PushReceiver {
    /// Listens on a free port of `host` (an address the daemon reaches this process at).
    pub fn start(host: &str) -> Result<PushReceiver, Failure> {
        let failure =
            |error: std::io::Error| Failure::runtime(format!("starting the push receiver: {error}"));
        let listener = std::net::TcpListener::bind((host, 0)).map_err(failure)?;
        listener.set_nonblocking(true).map_err(failure)?;
        let address = listener.local_addr().map_err(failure)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(failure)?;
        let tally = Arc::new(Mutex::new(Tally::new()));
        let shutdown = Arc::new(tokio::sync::Notify::new());
        let (served, stop) = (tally.clone(), shutdown.clone());
        let thread = std::thread::Builder::new()
            .name("push-receiver".to_owned())
            .spawn(move || runtime.block_on(serve(listener, served, stop)))
            .map_err(failure)?;
        let endpoint = match address {
            std::net::SocketAddr::V6(v6) => format!("http://[{}]:{}/push", v6.ip(), v6.port()),
            std::net::SocketAddr::V4(v4) => format!("http://{v4}/push"),
        };
        Ok(PushReceiver { endpoint, tally, shutdown, thread: Some(thread) })
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for PushReceiver {
    fn drop(&mut self) {
        // `notify_one` keeps a permit if the server is between two waits.
        self.shutdown.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    tally: Arc<Mutex<Tally>>,
    shutdown: Arc<tokio::sync::Notify>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            let mut tally = tally.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            tally.first_error.get_or_insert(format!("the push receiver cannot listen: {error}"));
            return;
        }
    };
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            shutdown.notified().await;
            None
        })
        .await;
        let stream = match accepted {
            None => return,
            Some(Ok((stream, _))) => stream,
            // Out of descriptors, say: the pushes are retried, and the run reports them lost if
            // they never arrive.
            Some(Err(_)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let tally = tally.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| answer(request, tally.clone()));
            let io = hyper_util::rt::TokioIo::new(stream);
            // A connection the daemon closes ends here; there is nothing to report.
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

/// Reads a push whole, records it and answers 204 (413 past `RECEIVER_BODY_BYTES_MAX`).
async fn answer(
    request: hyper::Request<hyper::body::Incoming>,
    tally: Arc<Mutex<Tally>>,
) -> Result<hyper::Response<Empty<Bytes>>, Infallible> {
    let body = Limited::new(request.into_body(), RECEIVER_BODY_BYTES_MAX).collect().await;
    let received = Instant::now();
    let mut tally = tally.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let status = match body {
        Ok(body) => {
            tally.record(&body.to_bytes(), received);
            hyper::StatusCode::NO_CONTENT
        }
        Err(error) => {
            tally.first_error.get_or_insert(format!("reading a push: {error}"));
            hyper::StatusCode::PAYLOAD_TOO_LARGE
        }
    };
    drop(tally);
    let mut response = hyper::Response::new(Empty::new());
    *response.status_mut() = status;
    Ok(response)
}

/// A wrapped push's message id and the stamp at the start of its data.
fn read_push(body: &[u8]) -> Option<(u64, Option<u64>)> {
    let id = string_field(body, b"\"messageId\":\"")?;
    let message_id = std::str::from_utf8(id).ok()?.parse().ok()?;
    // Base64 of the stamp's bytes: four characters for every three bytes.
    let stamp = string_field(body, b"\"data\":\"")
        .and_then(|data| decode_base64(data.get(..STAMP_BYTES.div_ceil(3) * 4)?))
        .and_then(|data| read_stamp(&data));
    Some((message_id, stamp))
}

/// The characters of the JSON string after `key` (the envelope's strings hold no escaped
/// quotes where they are read: digits and base64).
fn string_field<'a>(body: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let start = body.windows(key.len()).position(|window| window == key)? + key.len();
    let length = body[start..].iter().position(|&byte| byte == b'"')?;
    Some(&body[start..start + length])
}

/// Standard base64 (as Pub/Sub's envelope carries data), whole groups of four characters.
fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    let value = |character: u8| -> Option<u32> {
        Some(match character {
            b'A'..=b'Z' => character - b'A',
            b'a'..=b'z' => character - b'a' + 26,
            b'0'..=b'9' => character - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut bytes = Vec::with_capacity(text.len() / 4 * 3);
    for group in text.chunks_exact(4) {
        let padding = group.iter().rev().take_while(|&&character| character == b'=').count();
        let mut bits = 0u32;
        for &character in &group[..4 - padding] {
            bits = bits << 6 | value(character)?;
        }
        bits <<= 6 * padding as u32;
        bytes.extend_from_slice(&bits.to_be_bytes()[1..4 - padding]);
    }
    Some(bytes)
}

/// What the run's thread for the receiver needs of the run: when it may start, where to show
/// its figures, and when publishing is done and how much it acknowledged.
pub struct ReceiverContext<'a> {
    pub stop: &'a AtomicBool,
    pub setup_failed: &'a AtomicBool,
    pub start: &'a StartGate,
    pub live: &'a LiveStats,
    pub publishers_running: &'a AtomicUsize,
    pub acknowledged: &'a AtomicU64,
}

/// Waits, as a subscriber thread would, until every acknowledged message was pushed to the
/// receiver (or nothing new came for `DRAIN_IDLE_MAX` once publishing was done), copying its
/// figures to the progress line as it goes; then hands them back as a subscriber's.
pub fn receiver_run(
    receiver: &PushReceiver,
    context: &ReceiverContext,
) -> Result<Option<SubscriberOutcome>, Failure> {
    context.start.arrive_and_wait();
    if context.setup_failed.load(Ordering::Acquire) {
        return Ok(None);
    }
    let opened = Instant::now();
    let mut idle_since = opened;
    let mut seen = 0u64;
    let mut expected: Option<u64> = None;
    let timed_out = loop {
        std::thread::sleep(CHECK_INTERVAL);
        let now = Instant::now();
        let delivered = {
            let mut tally = receiver.tally();
            context
                .live
                .messages
                .fetch_add(std::mem::take(&mut tally.interval_deliveries), Ordering::Relaxed);
            let interval = std::mem::replace(&mut tally.interval_latency_us, new_histogram());
            let mut live = context.live.interval_latency_us.lock().unwrap();
            live.add(&interval).expect("histograms with equal bounds merge");
            tally.delivered.len()
        };
        if delivered > seen {
            seen = delivered;
            idle_since = now;
        }
        if expected.is_none() && context.publishers_running.load(Ordering::Acquire) == 0 {
            expected = Some(context.acknowledged.load(Ordering::Acquire));
            idle_since = idle_since.max(now);
        }
        if let Some(expected) = expected {
            if delivered >= expected {
                break false;
            }
            let idle_max =
                if context.stop.load(Ordering::Relaxed) { STOPPED_IDLE_MAX } else { DRAIN_IDLE_MAX };
            if now.saturating_duration_since(idle_since) > idle_max {
                break true;
            }
        }
    };
    let mut tally = receiver.tally();
    Ok(Some(SubscriberOutcome {
        targets: vec![0],
        delivered: vec![std::mem::take(&mut tally.delivered)],
        deliveries: tally.deliveries,
        duplicates: tally.duplicates,
        latency_us: std::mem::replace(&mut tally.latency_us, new_histogram()),
        // Every push is answered 204, which acknowledges it.
        acknowledged: tally.deliveries,
        acknowledge_failed: 0,
        opened,
        last_delivery: tally.last_delivery,
        timed_out,
        first_error: tally.first_error.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::publish::{payload_template, stamped_payload};

    #[test]
    fn base64_decodes_whole_groups_with_padding() {
        assert_eq!(decode_base64(b"aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64(b"aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
        assert_eq!(decode_base64(b"AAECAwQFBgcI").unwrap(), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(decode_base64(b"a-b_"), None, "URL-safe characters are not Pub/Sub's");
    }

    #[test]
    fn a_wrapped_push_gives_its_id_and_stamp() {
        let data = stamped_payload(&payload_template(64), 1, 2, 123_456_789);
        let base64 = encode_base64(&data);
        let body = format!(
            "{{\"message\":{{\"attributes\":{{}},\"data\":\"{base64}\",\"messageId\":\"42\",\"message_id\":\"42\",\"publishTime\":\"2026-12-06T10:00:00.123Z\"}},\"subscription\":\"projects/ringpost/subscriptions/s\"}}"
        );
        assert_eq!(read_push(body.as_bytes()), Some((42, Some(123_456_789))));
        assert_eq!(read_push(b"{\"message\":{}}"), None);
        let mut tally = Tally::new();
        let now = Instant::now();
        tally.record(body.as_bytes(), now);
        tally.record(body.as_bytes(), now);
        assert_eq!((tally.delivered.len(), tally.deliveries, tally.duplicates), (1, 2, 1));
        tally.record(b"{}", now);
        assert!(tally.first_error.is_some());
    }

    fn encode_base64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut text = String::new();
        for group in bytes.chunks(3) {
            let bits =
                group.iter().fold(0u32, |bits, &byte| bits << 8 | byte as u32) << (8 * (3 - group.len()));
            for index in 0..4 {
                match index <= group.len() {
                    true => text.push(ALPHABET[(bits >> (18 - 6 * index) & 63) as usize] as char),
                    false => text.push('='),
                }
            }
        }
        text
    }

    #[test]
    fn the_receiver_answers_204_and_counts() {
        let receiver = PushReceiver::start("127.0.0.1").unwrap();
        let data = stamped_payload(&payload_template(64), 1, 2, 5);
        let body = format!("{{\"message\":{{\"data\":\"{}\",\"messageId\":\"7\"}}}}", encode_base64(&data));
        let address = receiver.endpoint.trim_start_matches("http://").trim_end_matches("/push").to_owned();
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        let request = format!(
            "POST /push HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        std::io::Write::write_all(&mut stream, request.as_bytes()).unwrap();
        let mut answer = [0u8; 12];
        std::io::Read::read_exact(&mut stream, &mut answer).unwrap();
        assert_eq!(&answer, b"HTTP/1.1 204");
        let tally = receiver.tally();
        assert_eq!((tally.delivered.len(), tally.latency_us.len()), (1, 1));
    }
}
