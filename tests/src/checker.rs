//! A history checker with Jepsen's total-queue semantics for at-least-once Pub/Sub
//! (docs/TESTING.md, "The history checker"). Producers publish unique payloads; the checker is
//! told each publish's outcome and each delivery, and judges:
//! - lost: a publish acknowledged to its producer and never delivered (invalid);
//! - unexpected: a delivery of a payload nobody attempted, which would mean garbage was served
//!   (invalid);
//! - duplicates: payloads delivered more than once (reported, with their cause when known);
//! - recovered: publishes whose outcome was unknown (connection dropped) that were delivered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: must be delivered.
    Ok,
    /// Definitely refused before being written.
    Failed,
    /// Unknown: the connection dropped or timed out before an answer.
    Indeterminate,
}

impl Outcome {
    /// What a failed publish's error says of it: refused before anything was written
    /// (`InvalidArgument`, `NotFound`), or unknown (the connection dropped or the server failed
    /// mid-way: the publish may or may not be durable).
    pub fn of_error(error: &ringpost_client::Error) -> Outcome {
        use ringpost_client::{Error, ErrorCode};
        match error {
            Error::Status(status)
                if matches!(status.code, ErrorCode::InvalidArgument | ErrorCode::NotFound) =>
            {
                Outcome::Failed
            }
            _ => Outcome::Indeterminate,
        }
    }
}

#[derive(Default)]
struct History {
    published: HashMap<String, Outcome>,
    delivered: HashMap<String, u32>,
    redelivered_attempts: u64,
}

#[derive(Default)]
pub struct Checker {
    history: Mutex<History>,
}

#[derive(Debug, Default)]
pub struct Verdict {
    pub acknowledged: usize,
    pub delivered_distinct: usize,
    pub lost: Vec<String>,
    pub unexpected: Vec<String>,
    pub failed_but_delivered: Vec<String>,
    pub duplicates: usize,
    /// Deliveries with delivery_attempt > 1: redelivered after a deadline or a restart.
    pub redeliveries_reported_by_server: u64,
    pub recovered: usize,
}

impl Verdict {
    pub fn is_valid(&self) -> bool {
        self.lost.is_empty() && self.unexpected.is_empty() && self.failed_but_delivered.is_empty()
    }

    /// The run's figures in words, for a fault test's report line.
    pub fn summary(&self) -> String {
        format!(
            "{} publishes acknowledged, {} distinct delivered, {} duplicates ({} flagged as redeliveries by the \
             server), {} indeterminate publishes recovered, lost {}, unexpected {}",
            self.acknowledged,
            self.delivered_distinct,
            self.duplicates,
            self.redeliveries_reported_by_server,
            self.recovered,
            self.lost.len(),
            self.unexpected.len()
        )
    }
}

impl Checker {
    pub fn new() -> Checker {
        Checker::default()
    }

    pub fn published(&self, payload: &str, outcome: Outcome) {
        let mut history = self.history.lock().unwrap();
        let entry = history.published.entry(payload.to_owned()).or_insert(outcome);
        // A later definite answer for the same payload (a retry) wins over an unknown one.
        if *entry != Outcome::Ok {
            *entry = outcome;
        }
    }

    pub fn delivered(&self, payload: &str, delivery_attempt: u32) {
        let mut history = self.history.lock().unwrap();
        *history.delivered.entry(payload.to_owned()).or_insert(0) += 1;
        if delivery_attempt > 1 {
            history.redelivered_attempts += 1;
        }
    }

    /// Acknowledged payloads not yet delivered.
    pub fn missing(&self) -> BTreeSet<String> {
        let history = self.history.lock().unwrap();
        history
            .published
            .iter()
            .filter(|(payload, outcome)| {
                **outcome == Outcome::Ok && !history.delivered.contains_key(*payload)
            })
            .map(|(payload, _)| payload.clone())
            .collect()
    }

    pub fn verdict(&self) -> Verdict {
        let history = self.history.lock().unwrap();
        let mut verdict = Verdict {
            redeliveries_reported_by_server: history.redelivered_attempts,
            delivered_distinct: history.delivered.len(),
            ..Verdict::default()
        };
        for (payload, outcome) in &history.published {
            let delivered = history.delivered.contains_key(payload);
            match outcome {
                Outcome::Ok => {
                    verdict.acknowledged += 1;
                    if !delivered {
                        verdict.lost.push(payload.clone());
                    }
                }
                Outcome::Failed if delivered => verdict.failed_but_delivered.push(payload.clone()),
                Outcome::Indeterminate if delivered => verdict.recovered += 1,
                _ => {}
            }
        }
        for (payload, count) in &history.delivered {
            if !history.published.contains_key(payload) {
                verdict.unexpected.push(payload.clone());
            }
            if *count > 1 {
                verdict.duplicates += (*count - 1) as usize;
            }
        }
        verdict.lost.sort();
        verdict
    }

    /// Lost payloads grouped by producer, with where in each producer's sequence they fall
    /// (prefix, middle or postfix of what it had acknowledged), as Jepsen's NATS analysis does.
    pub fn lost_by_producer(&self, lost: &[String]) -> BTreeMap<String, Vec<u64>> {
        let mut grouped: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for payload in lost {
            if let Some((producer, sequence)) = payload.rsplit_once('-') {
                grouped.entry(producer.to_owned()).or_default().push(sequence.parse().unwrap_or(0));
            }
        }
        grouped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let checker = Checker::new();
        checker.published("p0-1", Outcome::Ok);
        checker.published("p0-2", Outcome::Ok);
        checker.published("p0-3", Outcome::Indeterminate);
        checker.published("p0-4", Outcome::Failed);
        checker.delivered("p0-1", 1);
        checker.delivered("p0-1", 2);
        checker.delivered("p0-3", 1);
        checker.delivered("zz-9", 1);
        let verdict = checker.verdict();
        assert_eq!(verdict.lost, vec!["p0-2".to_string()]);
        assert_eq!(verdict.unexpected, vec!["zz-9".to_string()]);
        assert_eq!(verdict.duplicates, 1);
        assert_eq!(verdict.recovered, 1);
        assert!(!verdict.is_valid());
        checker.published("p0-4", Outcome::Failed);
        assert!(checker.verdict().failed_but_delivered.is_empty());
    }
}
