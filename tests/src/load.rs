//! A cluster's workload for fault tests: publishers and acknowledging subscribers on one topic,
//! each thread on a client of one of the running nodes' routers (chosen at random, changed
//! after any failure), every outcome recorded in a `Checker`. Beside the checker's verdict it
//! records which messages' acknowledgements were confirmed, and which of those were delivered
//! again by a pull sent after the confirmation (which must never happen).

use crate::checker::{Checker, Outcome, Verdict};
use crate::Random;
use ringpost_client::{block_on, Client, Message, RetrySettings};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MESSAGES_PER_PUBLISH: u64 = 5;
const PUBLISH_PAUSE: Duration = Duration::from_millis(5);
const PULL_MESSAGES_MAX: u32 = 200;
const PULL_WAIT_MS: u32 = 300;

pub struct Load {
    pub checker: Arc<Checker>,
    /// The routers the threads connect to: the test keeps it to the running nodes'.
    pub routers: Arc<RwLock<Vec<String>>>,
    stop_publishing: Arc<AtomicBool>,
    stop_subscribing: Arc<AtomicBool>,
    acknowledged_publishes: Arc<AtomicU64>,
    confirmed: Arc<Mutex<HashMap<String, Instant>>>,
    delivered_after_ack: Arc<Mutex<Vec<String>>>,
    publishers: Vec<JoinHandle<()>>,
    subscribers: Vec<JoinHandle<()>>,
}

/// What a finished load found.
pub struct Outcomes {
    pub verdict: Verdict,
    /// Acknowledgements confirmed to a subscriber.
    pub confirmed: usize,
    /// Messages delivered again by a pull sent after their acknowledgement was confirmed.
    pub delivered_after_ack: Vec<String>,
}

/// A client of one of `routers`, chosen at random, that returns every failure at once (the
/// caller connects again, maybe to another node).
fn connect(routers: &RwLock<Vec<String>>, random: &mut Random) -> Option<Client> {
    let routers = routers.read().unwrap().clone();
    if routers.is_empty() {
        return None;
    }
    let address = &routers[random.between(0, routers.len() as u64) as usize];
    let client = block_on(Client::connect(address)).ok()?;
    Some(client.with_retry(RetrySettings::NONE, RetrySettings::NONE))
}

impl Load {
    /// Starts `publishers` publishing to `topic` and `subscribers` pulling and acknowledging
    /// `subscription`, through `routers`.
    pub fn start(
        topic: &str,
        subscription: &str,
        routers: Vec<String>,
        publishers: usize,
        subscribers: usize,
    ) -> Load {
        let mut load = Load {
            checker: Arc::new(Checker::new()),
            routers: Arc::new(RwLock::new(routers)),
            stop_publishing: Arc::default(),
            stop_subscribing: Arc::default(),
            acknowledged_publishes: Arc::default(),
            confirmed: Arc::default(),
            delivered_after_ack: Arc::default(),
            publishers: Vec::new(),
            subscribers: Vec::new(),
        };
        for publisher in 0..publishers {
            let (routers, checker, stop) =
                (load.routers.clone(), load.checker.clone(), load.stop_publishing.clone());
            let acknowledged = load.acknowledged_publishes.clone();
            let topic = topic.to_owned();
            load.publishers.push(std::thread::spawn(move || {
                let mut random = Random::from_time();
                let mut sequence = 0u64;
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(connected) = client.take().or_else(|| connect(&routers, &mut random)) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let payloads: Vec<String> = (sequence..sequence + MESSAGES_PER_PUBLISH)
                        .map(|s| format!("p{publisher}-{s}"))
                        .collect();
                    sequence += MESSAGES_PER_PUBLISH;
                    std::thread::sleep(PUBLISH_PAUSE);
                    let messages = payloads.iter().map(|p| Message::new(p.as_str())).collect();
                    match block_on(connected.publish(&topic, messages)) {
                        Ok(ids) => {
                            assert_eq!(ids.len(), payloads.len());
                            payloads.iter().for_each(|p| checker.published(p, Outcome::Ok));
                            acknowledged.fetch_add(1, Ordering::Relaxed);
                            client = Some(connected);
                        }
                        Err(error) => {
                            let outcome = Outcome::of_error(&error);
                            assert_ne!(outcome, Outcome::Failed, "unexpected refusal: {error}");
                            payloads.iter().for_each(|p| checker.published(p, outcome));
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            }));
        }
        for _ in 0..subscribers {
            let (routers, checker, stop) =
                (load.routers.clone(), load.checker.clone(), load.stop_subscribing.clone());
            let (confirmed, delivered_after_ack) = (load.confirmed.clone(), load.delivered_after_ack.clone());
            let subscription = subscription.to_owned();
            load.subscribers.push(std::thread::spawn(move || {
                let mut random = Random::from_time();
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    let Some(connected) = client.take().or_else(|| connect(&routers, &mut random)) else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let pull_sent = Instant::now();
                    let messages =
                        match block_on(connected.pull(&subscription, PULL_MESSAGES_MAX, PULL_WAIT_MS)) {
                            Ok(messages) => messages,
                            Err(_) => {
                                std::thread::sleep(Duration::from_millis(20));
                                continue;
                            }
                        };
                    let mut ack_ids = Vec::with_capacity(messages.len());
                    let mut payloads = Vec::with_capacity(messages.len());
                    for message in messages {
                        let payload = String::from_utf8(message.data).expect("payloads are UTF-8");
                        checker.delivered(&payload, message.delivery_attempt);
                        // Judged only for pulls sent after the confirmation: one sent before may
                        // have been answered before the acknowledgement was applied.
                        if confirmed.lock().unwrap().get(&payload).is_some_and(|at| *at < pull_sent) {
                            delivered_after_ack.lock().unwrap().push(payload.clone());
                        }
                        ack_ids.push(message.ack_id);
                        payloads.push(payload);
                    }
                    if !ack_ids.is_empty() {
                        match block_on(connected.acknowledge(&subscription, ack_ids.clone())) {
                            Ok(refused) => {
                                let refused: HashSet<&str> =
                                    refused.iter().map(|invalid| invalid.ack_id.as_str()).collect();
                                let mut confirmed = confirmed.lock().unwrap();
                                let now = Instant::now();
                                for (ack_id, payload) in ack_ids.iter().zip(payloads) {
                                    if !refused.contains(ack_id.as_str()) {
                                        confirmed.entry(payload).or_insert(now);
                                    }
                                }
                            }
                            Err(_) => continue,
                        }
                    }
                    client = Some(connected);
                }
            }));
        }
        load
    }

    /// Publishes acknowledged so far (each of `MESSAGES_PER_PUBLISH` messages).
    pub fn acknowledged_publishes(&self) -> u64 {
        self.acknowledged_publishes.load(Ordering::Relaxed)
    }

    /// Waits until a publish is acknowledged after this call (panics after `within`, naming
    /// `what`); returns how long it took.
    pub fn wait_for_publishes(&self, what: &str, within: Duration) -> Duration {
        let started = Instant::now();
        let before = self.acknowledged_publishes();
        while self.acknowledged_publishes() <= before {
            assert!(started.elapsed() < within, "{what}: no publish acknowledged within {within:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        started.elapsed()
    }

    /// Stops the publishers, lets the subscribers drain what was published (at most
    /// `drain_timeout`), stops them and returns what was found.
    pub fn finish(self, drain_timeout: Duration) -> Outcomes {
        self.stop_publishing.store(true, Ordering::Relaxed);
        for publisher in self.publishers {
            publisher.join().unwrap();
        }
        let drain_started = Instant::now();
        while !self.checker.missing().is_empty() && drain_started.elapsed() < drain_timeout {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.stop_subscribing.store(true, Ordering::Relaxed);
        for subscriber in self.subscribers {
            subscriber.join().unwrap();
        }
        Outcomes {
            verdict: self.checker.verdict(),
            confirmed: self.confirmed.lock().unwrap().len(),
            delivered_after_ack: std::mem::take(&mut *self.delivered_after_ack.lock().unwrap()),
        }
    }
}

impl Outcomes {
    /// One line of what the run found, after `label`.
    pub fn report(&self, label: &str) {
        eprintln!(
            "{label}: {}; {} deliveries acknowledged and confirmed, {} of them delivered again after",
            self.verdict.summary(),
            self.confirmed,
            self.delivered_after_ack.len()
        );
    }

    /// Asserts the queue's properties: something was acknowledged, nothing acknowledged lost,
    /// nothing delivered that was not published, nothing refused delivered, and nothing
    /// delivered again after its acknowledgement was confirmed. `context` (the nodes' logs)
    /// is shown with lost messages.
    pub fn assert_safe(&self, checker: &Checker, context: impl FnOnce() -> String) {
        let verdict = &self.verdict;
        assert!(verdict.acknowledged > 0, "no publish was ever acknowledged: the test proved nothing");
        assert!(
            verdict.lost.is_empty(),
            "{} acknowledged publishes lost, by producer: {:?}\n{}",
            verdict.lost.len(),
            checker.lost_by_producer(&verdict.lost),
            context()
        );
        assert!(verdict.unexpected.is_empty(), "delivered but never published: {:?}", verdict.unexpected);
        assert!(verdict.failed_but_delivered.is_empty());
        assert!(
            self.delivered_after_ack.is_empty(),
            "acknowledged, then delivered again: {:?}",
            self.delivered_after_ack
        );
    }
}
