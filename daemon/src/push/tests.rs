//! The push tasks on a real forwarder shard (SimDisk, the simulation's virtual clock), with a
//! fake HTTP client in place of the daemon's: what is pushed, acknowledged and given back, the
//! retry backoff, the window, ordering keys, and when a task stops.

use super::task::serve;
use super::{PushOutcome, PushRequest, Pusher};
use crate::api::data::{DataPlane, PullSettings};
use crate::catalog::{PushConfig, PushWrapper, SubscriptionSettings};
use crate::clock::SystemClock;
use crate::control::{ControlRequest, SettingsUpdate};
use crate::ids::TopicId;
use crate::log::{Directories, LogConfig};
use crate::protocol::native::forwarder as native;
use crate::runtime::sim;
use crate::shard::Forwarder;
use crate::storage::sim::SimDisk;
use crate::subscription::SubscriptionEntry;
use ringpost_wire::frame::FrameBuffer;
use ringpost_wire::limits::FRAME_HEADER_BYTES;
use ringpost_wire::messages::{PublishRequest, PubsubMessage};
use ringpost_wire::Command;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How the fake endpoint answers a request: after how long, and with what.
type Answering = Box<dyn Fn(&Received) -> (Duration, PushOutcome)>;

/// A request the fake endpoint received, decoded from the wrapped body.
#[derive(Clone, Debug)]
struct Received {
    at: Instant,
    message_id: u64,
    data: String,
    ordering_key: String,
    /// How many times this message was pushed, this one included.
    attempt: usize,
}

/// The fake HTTP client: records each request and answers as told, honouring the request's
/// timeout as the daemon's client does.
struct FakeEndpoint {
    answering: RefCell<Answering>,
    received: RefCell<Vec<Received>>,
    outstanding: Cell<usize>,
    outstanding_max: Cell<usize>,
}

impl FakeEndpoint {
    fn new(answering: impl Fn(&Received) -> (Duration, PushOutcome) + 'static) -> Rc<FakeEndpoint> {
        Rc::new(FakeEndpoint {
            answering: RefCell::new(Box::new(answering)),
            received: RefCell::default(),
            outstanding: Cell::new(0),
            outstanding_max: Cell::new(0),
        })
    }

    fn answer_with(&self, answering: impl Fn(&Received) -> (Duration, PushOutcome) + 'static) {
        *self.answering.borrow_mut() = Box::new(answering);
    }

    fn received(&self) -> Vec<Received> {
        self.received.borrow().clone()
    }

    /// Distinct messages received.
    fn distinct(&self) -> usize {
        let mut ids: Vec<u64> = self.received.borrow().iter().map(|received| received.message_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

/// A JSON string field's value in `json` (the bodies here have no escapes but in data).
fn field<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let start = json.find(&format!("\"{name}\":\""))? + name.len() + 4;
    Some(&json[start..start + json[start..].find('"')?])
}

impl Pusher for FakeEndpoint {
    async fn push(&self, request: PushRequest) -> PushOutcome {
        let json = String::from_utf8(request.body.body.clone()).unwrap();
        let message_id: u64 = field(&json, "messageId").unwrap().parse().unwrap();
        let attempt = 1 + self.received.borrow().iter().filter(|seen| seen.message_id == message_id).count();
        let received = Received {
            at: crate::runtime::now(),
            message_id,
            data: field(&json, "data").unwrap().to_owned(),
            ordering_key: field(&json, "orderingKey").unwrap_or("").to_owned(),
            attempt,
        };
        let (delay, outcome) = (self.answering.borrow())(&received);
        self.received.borrow_mut().push(received);
        self.outstanding.set(self.outstanding.get() + 1);
        self.outstanding_max.set(self.outstanding_max.get().max(self.outstanding.get()));
        let outcome = if delay > request.timeout {
            crate::runtime::sleep(request.timeout).await;
            PushOutcome::Timeout
        } else {
            crate::runtime::sleep(delay).await;
            outcome
        };
        self.outstanding.set(self.outstanding.get() - 1);
        outcome
    }
}

const ACK_DEADLINE_SECONDS: u32 = 10;

fn push_settings(ordered: bool, backoff_seconds: (u32, u32)) -> SubscriptionSettings {
    SubscriptionSettings {
        ack_deadline_seconds: ACK_DEADLINE_SECONDS,
        message_retention_seconds: 7 * 24 * 3600,
        enable_message_ordering: ordered,
        minimum_backoff_seconds: backoff_seconds.0,
        maximum_backoff_seconds: backoff_seconds.1,
        push: Some(Box::new(PushConfig {
            endpoint: "http://127.0.0.1:9/push".into(),
            wrapper: PushWrapper::Pubsub,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A forwarder serving topic "events" (id 7) and push subscription "pushed" (id 9), its
/// pushing served with `endpoint`.
async fn pushing_forwarder(
    settings: SubscriptionSettings,
    endpoint: &Rc<FakeEndpoint>,
) -> Rc<Forwarder<SimDisk>> {
    let config =
        LogConfig { segment_bytes_initial: 64 * 1024, segment_bytes_max: 64 * 1024, ..LogConfig::default() };
    let forwarder = Rc::new(Forwarder::new(
        0,
        SimDisk::new(),
        Directories::new(vec!["/d0".into()]),
        config,
        Rc::new(SystemClock),
    ));
    crate::runtime::spawn(serve(forwarder.clone(), endpoint.clone())).detach();
    forwarder
        .control(ControlRequest::AttachTopic {
            topic_id: TopicId::new(7),
            name: "events".into(),
            retention_seconds: 0,
            recovering: false,
            source: crate::ids::SourceId::FIRST,
            active: 1,
        })
        .await
        .unwrap();
    forwarder
        .control(ControlRequest::AttachSubscription {
            subscription_id: 9,
            name: "pushed".into(),
            topic_id: TopicId::new(7),
            settings,
            create: true,
            start_offset: 0,
        })
        .await
        .unwrap();
    forwarder
}

fn entry(forwarder: &Forwarder<SimDisk>) -> Rc<SubscriptionEntry> {
    forwarder.subscription("pushed").unwrap().0
}

async fn publish(forwarder: &Forwarder<SimDisk>, messages: Vec<(String, String)>) {
    let messages = messages
        .into_iter()
        .map(|(data, ordering_key)| PubsubMessage {
            data: data.into_bytes(),
            ordering_key,
            ..Default::default()
        })
        .collect();
    let request = PublishRequest { topic: "events".into(), messages };
    let frame = ringpost_wire::encode_frame(Command::Publish.code(), 0, 1, &request);
    let mut body = FrameBuffer::new();
    body.extend_from_slice(&frame[FRAME_HEADER_BYTES..]);
    native::publish_unchecked(forwarder, body).await.unwrap();
}

async fn publish_unordered(forwarder: &Forwarder<SimDisk>, count: usize) {
    publish(forwarder, (0..count).map(|index| (format!("m{index}"), String::new())).collect()).await;
}

/// Everything the subscription holds is acknowledged.
fn all_acknowledged(forwarder: &Forwarder<SimDisk>) -> bool {
    let topic = forwarder.topic("events").unwrap();
    entry(forwarder).state.borrow().backlog(topic.log.end_offset()) == 0
}

#[test]
fn successes_acknowledge_and_nothing_is_pushed_again() {
    sim::run(1, async {
        let endpoint = FakeEndpoint::new(|_| (Duration::from_millis(20), PushOutcome::Status(200)));
        let forwarder = pushing_forwarder(push_settings(false, (0, 0)), &endpoint).await;
        publish_unordered(&forwarder, 50).await;
        crate::runtime::sleep(Duration::from_secs(5)).await;
        assert_eq!(endpoint.distinct(), 50);
        assert_eq!(endpoint.received().len(), 50, "nothing pushed twice");
        // The data is the message's, in base64 ("m0").
        assert!(endpoint.received().iter().any(|received| received.data == "bTA="));
        assert!(all_acknowledged(&forwarder));
        // 204 acknowledges as well; a minute later nothing came again.
        endpoint.answer_with(|_| (Duration::from_millis(20), PushOutcome::Status(204)));
        publish_unordered(&forwarder, 10).await;
        crate::runtime::sleep(Duration::from_secs(60)).await;
        assert_eq!(endpoint.received().len(), 60);
        assert!(all_acknowledged(&forwarder));
        // The window grew from its start while the endpoint succeeded.
        let window = forwarder.pushing.flight("pushed").unwrap().window.borrow().size();
        assert!(window > super::window::PUSH_WINDOW_INITIAL, "window {window}");
        assert_eq!(forwarder.pushing.body_bytes(), 0);
        forwarder.stop_handle().give();
    });
}

#[test]
fn failures_are_retried_with_the_policys_backoff_until_one_succeeds() {
    sim::run(2, async {
        // 500, 400 and a refused connection, then success at the fifth attempt.
        let endpoint = FakeEndpoint::new(|received| {
            let outcome = match received.attempt {
                1 | 4 => PushOutcome::Status(500),
                2 => PushOutcome::Status(400),
                3 => PushOutcome::ConnectionError("connection refused".into()),
                _ => PushOutcome::Status(200),
            };
            (Duration::from_millis(10), outcome)
        });
        let forwarder = pushing_forwarder(push_settings(false, (1, 4)), &endpoint).await;
        publish_unordered(&forwarder, 1).await;
        crate::runtime::sleep(Duration::from_secs(30)).await;
        let received = endpoint.received();
        assert_eq!(received.len(), 5, "{received:?}");
        assert!(all_acknowledged(&forwarder));
        // Backoff after failed attempt n: 1 s, 2 s, 4 s, then 4 s (the maximum).
        for (gap, seconds) in received.windows(2).zip([1u64, 2, 4, 4]) {
            let waited = gap[1].at - gap[0].at;
            let expected = Duration::from_secs(seconds);
            assert!(
                waited >= expected && waited < expected + Duration::from_secs(2),
                "waited {waited:?}, expected {expected:?}: {received:?}"
            );
        }
        let last_error = forwarder.pushing.flight("pushed").unwrap().last_error.borrow().clone();
        assert_eq!(last_error.as_deref(), Some("HTTP status 500"));
        forwarder.stop_handle().give();
    });
}

#[test]
fn a_receiver_slower_than_the_ack_deadline_times_out_and_shrinks_the_window() {
    sim::run(3, async {
        let endpoint = FakeEndpoint::new(|_| (Duration::from_secs(60), PushOutcome::Status(200)));
        let forwarder = pushing_forwarder(push_settings(false, (0, 0)), &endpoint).await;
        publish_unordered(&forwarder, 40).await;
        crate::runtime::sleep(Duration::from_secs(45)).await;
        let flight = forwarder.pushing.flight("pushed").unwrap();
        assert_eq!(flight.window.borrow().size(), super::window::PUSH_WINDOW_MIN);
        assert!(!all_acknowledged(&forwarder));
        assert_eq!(flight.last_error.borrow().as_deref(), Some("no answer within the ack deadline"));
        // Never more outstanding than the initial window, and the bodies held are those.
        assert!(endpoint.outstanding_max.get() <= super::window::PUSH_WINDOW_INITIAL as usize);
        assert!(forwarder.pushing.body_bytes() <= 4 * 400);
        // At the floor, one push at a time.
        endpoint.outstanding_max.set(0);
        crate::runtime::sleep(Duration::from_secs(30)).await;
        assert_eq!(endpoint.outstanding_max.get(), 1);
        // The receiver recovers: everything arrives, none lost, and the window grows again.
        endpoint.answer_with(|_| (Duration::from_millis(10), PushOutcome::Status(200)));
        crate::runtime::sleep(Duration::from_secs(60)).await;
        assert_eq!(endpoint.distinct(), 40);
        assert!(all_acknowledged(&forwarder));
        assert!(flight.window.borrow().size() > super::window::PUSH_WINDOW_MIN);
        forwarder.stop_handle().give();
    });
}

#[test]
fn an_ordering_key_has_one_message_in_flight_and_keeps_its_order() {
    sim::run(4, async {
        // Every third push fails, so that keys wait on retries.
        let pushes = Rc::new(Cell::new(0u32));
        let counted = pushes.clone();
        let endpoint = FakeEndpoint::new(move |_| {
            counted.set(counted.get() + 1);
            let status = if counted.get().is_multiple_of(3) { 503 } else { 200 };
            (Duration::from_millis(50), PushOutcome::Status(status))
        });
        let forwarder = pushing_forwarder(push_settings(true, (0, 0)), &endpoint).await;
        let messages = (0..60).map(|index| (format!("{index}"), format!("key-{}", index % 3))).collect();
        publish(&forwarder, messages).await;
        crate::runtime::sleep(Duration::from_secs(60)).await;
        assert!(all_acknowledged(&forwarder));
        let received = endpoint.received();
        for key in ["key-0", "key-1", "key-2"] {
            let pushed: Vec<&Received> = received.iter().filter(|seen| seen.ordering_key == key).collect();
            // One at a time: each push of the key starts after the one before it was answered.
            for pair in pushed.windows(2) {
                assert!(pair[1].at >= pair[0].at + Duration::from_millis(50), "{key}: {pair:?}");
            }
            // In order: the first push of each message follows the previous message's.
            let firsts: Vec<u64> =
                pushed.iter().filter(|seen| seen.attempt == 1).map(|seen| seen.message_id).collect();
            assert_eq!(firsts.len(), 20);
            let mut sorted = firsts.clone();
            sorted.sort_unstable();
            assert_eq!(firsts, sorted, "{key}");
        }
        forwarder.stop_handle().give();
    });
}

#[test]
fn the_task_stops_when_the_subscription_is_updated_to_pull_and_a_pull_gets_its_messages() {
    sim::run(5, async {
        // An endpoint that never answers within the deadline.
        let endpoint = FakeEndpoint::new(|_| (Duration::from_secs(3600), PushOutcome::Status(200)));
        let forwarder = pushing_forwarder(push_settings(false, (0, 0)), &endpoint).await;
        publish_unordered(&forwarder, 5).await;
        crate::runtime::sleep(Duration::from_secs(1)).await;
        assert!(entry(&forwarder).pushing.get());
        assert!(!endpoint.received().is_empty());
        let mut pull_settings = push_settings(false, (0, 0));
        pull_settings.push = None;
        forwarder
            .control(ControlRequest::UpdateSettings {
                topic_id: TopicId::new(7),
                update: SettingsUpdate::Subscription { subscription_id: 9, settings: pull_settings },
            })
            .await
            .unwrap();
        crate::runtime::sleep(Duration::from_millis(10)).await;
        assert!(!entry(&forwarder).pushing.get(), "the task stopped");
        assert!(forwarder.pushing.flight("pushed").is_none());
        // Its leases were given back at once: a pull gets all five now, not at their deadline.
        let pulled = forwarder.pull("pushed", PullSettings::new(10, 0).unwrap()).await.unwrap().unwrap();
        assert_eq!(pulled.messages.len(), 5);
        drop(pulled);
        // Updated to push again, it pushes again; deleted, it stops.
        forwarder
            .control(ControlRequest::UpdateSettings {
                topic_id: TopicId::new(7),
                update: SettingsUpdate::Subscription {
                    subscription_id: 9,
                    settings: push_settings(false, (0, 0)),
                },
            })
            .await
            .unwrap();
        crate::runtime::sleep(Duration::from_millis(10)).await;
        let pushing = entry(&forwarder);
        assert!(pushing.pushing.get());
        forwarder
            .control(ControlRequest::DetachSubscription {
                subscription_id: 9,
                name: "pushed".into(),
                topic_id: TopicId::new(7),
                deleted: true,
            })
            .await
            .unwrap();
        crate::runtime::sleep(Duration::from_millis(10)).await;
        assert!(!pushing.pushing.get(), "the task stopped at the deletion");
        forwarder.stop_handle().give();
    });
}

#[test]
fn the_task_stops_with_its_shard() {
    sim::run(6, async {
        let endpoint = FakeEndpoint::new(|_| (Duration::from_secs(3600), PushOutcome::Status(200)));
        let forwarder = pushing_forwarder(push_settings(false, (0, 0)), &endpoint).await;
        publish_unordered(&forwarder, 3).await;
        crate::runtime::sleep(Duration::from_secs(1)).await;
        assert!(entry(&forwarder).pushing.get());
        forwarder.stop_handle().give();
        crate::runtime::sleep(Duration::from_millis(10)).await;
        assert!(!entry(&forwarder).pushing.get());
    });
}

/// The push figures of the subscription's stats, as the router gathers them.
async fn push_stats(forwarder: &Forwarder<SimDisk>) -> (crate::api::stats::PushStats, u64) {
    let topics = forwarder.topic_stats().await;
    let subscription =
        topics[0].subscriptions.iter().find(|subscription| subscription.name == "pushed").unwrap();
    (
        subscription.push.clone().expect("a push subscription's stats have push figures"),
        subscription.backlog_messages,
    )
}

fn count(push: &crate::api::stats::PushStats, class: &str) -> u64 {
    push.requests_by_class.iter().find(|(named, _)| named == class).map_or(0, |(_, count)| *count)
}

#[test]
fn the_stats_show_the_endpoint_window_last_error_and_pushes_by_class() {
    sim::run(7, async {
        // Each message's first push answers 500, its second 200.
        let endpoint = FakeEndpoint::new(|received| {
            let status = if received.attempt == 1 { 500 } else { 200 };
            (Duration::from_millis(10), PushOutcome::Status(status))
        });
        let forwarder = pushing_forwarder(push_settings(false, (0, 0)), &endpoint).await;
        // Its task starts at the shard's next turn.
        crate::runtime::sleep(Duration::from_millis(10)).await;
        let (push, backlog) = push_stats(&forwarder).await;
        assert_eq!(push.endpoint, "http://127.0.0.1:9/push");
        assert_eq!((push.window, push.outstanding, backlog), (super::window::PUSH_WINDOW_INITIAL, 0, 0));
        assert_eq!(push.last_error, None);

        publish_unordered(&forwarder, 20).await;
        crate::runtime::sleep(Duration::from_secs(10)).await;
        assert!(all_acknowledged(&forwarder));
        let (push, backlog) = push_stats(&forwarder).await;
        assert_eq!((count(&push, "2xx"), count(&push, "5xx"), count(&push, "timeout")), (20, 20, 0));
        let classes: Vec<&str> = push.requests_by_class.iter().map(|(class, _)| class.as_str()).collect();
        assert_eq!(classes, super::client::PUSH_OUTCOME_CLASSES);
        // The last error is kept after the successes that followed it, with its age.
        let error = push.last_error.clone().expect("the 500s are remembered");
        assert_eq!(error.reason, "HTTP status 500");
        assert!((5_000..=10_000).contains(&error.ms_ago), "{error:?}");
        assert_eq!((push.failures_in_a_row, push.outstanding, backlog), (0, 0, 0));
        let window = push.window;

        // An endpoint that fails for good: the failures in a row grow, the window shrinks, the
        // backlog stays.
        endpoint.answer_with(|_| (Duration::from_millis(10), PushOutcome::ConnectionError("refused".into())));
        publish_unordered(&forwarder, 3).await;
        crate::runtime::sleep(Duration::from_secs(5)).await;
        let (push, backlog) = push_stats(&forwarder).await;
        assert_eq!(backlog, 3);
        assert!(push.failures_in_a_row >= 3, "{push:?}");
        assert!(push.window < window, "{push:?}");
        assert_eq!(push.last_error.as_ref().unwrap().reason, "connection error: refused");
        assert!(count(&push, "connection_error") >= 3);

        // Made a pull subscription, it has no push figures.
        let mut pull_settings = push_settings(false, (0, 0));
        pull_settings.push = None;
        forwarder
            .control(ControlRequest::UpdateSettings {
                topic_id: TopicId::new(7),
                update: SettingsUpdate::Subscription { subscription_id: 9, settings: pull_settings },
            })
            .await
            .unwrap();
        assert_eq!(forwarder.topic_stats().await[0].subscriptions[0].push, None);
        forwarder.stop_handle().give();
    });
}
