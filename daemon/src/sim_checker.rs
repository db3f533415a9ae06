//! The queue checker of the seeded simulations (`sim_tests`, `sim_node_tests`): it judges one
//! subscription's history with at-least-once semantics. Every acknowledged publish is
//! delivered at least once; nothing is delivered that was never published; a message whose
//! acknowledgement was confirmed is never delivered again (the workloads never seek, which
//! alone would explain it). With exactly-once delivery, also not while that acknowledgement
//! was in flight (`confirmed_exactly_once`).

use std::collections::{HashMap, HashSet};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// The publish was answered with its ids: it must be delivered.
    Acknowledged,
    /// An error, or no answer before the crash: it may or may not be delivered.
    Indeterminate,
}

/// The queue checker, for one subscription, kept as the simulation goes.
#[derive(Default)]
pub struct Checker {
    pub published: HashMap<Vec<u8>, Outcome>,
    pub deliveries: HashMap<Vec<u8>, u32>,
    /// Messages whose acknowledgement the forwarder confirmed: never delivered again.
    pub acknowledged: HashSet<Vec<u8>>,
    pub next_message: u64,
    pub redeliveries: u64,
    pub publishes_refused: u64,
}

impl Checker {
    pub fn delivered(&mut self, seed: u64, data: &[u8]) {
        assert!(
            self.published.contains_key(data),
            "seed {seed}: delivered a message never published: {data:?}"
        );
        assert!(
            !self.acknowledged.contains(data),
            "seed {seed}: delivered {} again after its acknowledgement was confirmed",
            name_of(data)
        );
        let count = self.deliveries.entry(data.to_vec()).or_insert(0);
        *count += 1;
        self.redeliveries += u64::from(*count > 1);
    }

    /// How often a message was delivered so far: taken when its acknowledgement is sent, for
    /// `confirmed_exactly_once`.
    pub fn deliveries_of(&self, data: &[u8]) -> u32 {
        self.deliveries.get(data).copied().unwrap_or(0)
    }

    /// Exactly-once delivery: an acknowledgement was confirmed that was sent when the message
    /// had been delivered `deliveries_at_send` times. It was accepted for the lease it named,
    /// so no delivery may have come between (the lease was pinned while the acknowledgement
    /// was made durable); `delivered` checks that none comes after.
    pub fn confirmed_exactly_once(&mut self, seed: u64, data: &[u8], deliveries_at_send: u32) {
        assert_eq!(
            self.deliveries_of(data),
            deliveries_at_send,
            "seed {seed}: exactly-once: {} was delivered again while its acknowledgement, then confirmed, was in flight",
            name_of(data)
        );
        self.acknowledged.insert(data.to_vec());
    }

    /// Acknowledged publishes never delivered.
    pub fn lost(&self) -> Vec<String> {
        let mut lost: Vec<String> = self
            .published
            .iter()
            .filter(|(data, outcome)| {
                **outcome == Outcome::Acknowledged && !self.deliveries.contains_key(*data)
            })
            .map(|(data, _)| String::from_utf8_lossy(data).into_owned())
            .collect();
        lost.sort();
        lost
    }
}

/// A message's name (`life-L/message-N`), without the fill that follows it.
fn name_of(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    text.rsplit_once('/').map_or(text.to_string(), |(name, _)| name.to_owned())
}
