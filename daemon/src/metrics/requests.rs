//! Requests a shard answered, by command and status code, and how long they took: the
//! service-level indicators a monitoring system computes error rates and latencies from. A
//! shard is one thread, so its table is thread-local and counting is plain additions, no
//! atomic and no lock; a scrape asks each shard for a copy (`ControlRequest::Requests`).
//!
//! Commands and codes are numbers here (the protocol names them); a command's duration runs
//! from its dispatch to its answer, so a publish's includes its durable (and replicated)
//! commit. Streams are counted when they end; their durations, a subscriber's whole session,
//! are left out of the histograms.

use std::cell::RefCell;
use std::time::Duration;

use super::histogram::DurationHistogram;

/// Commands are counted by code below this; larger codes share the last slot.
pub const COMMAND_CODES_COUNTED: usize = 128;
/// Status codes are counted by number below this (the gRPC codes and Ringpost's own, 100 and
/// 101, folded into 17 and 18); others share the last slot.
pub const STATUS_SLOTS: usize = 20;

/// One command's figures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandFigures {
    pub command: u16,
    /// (status code, requests answered with it), the codes seen only.
    pub codes: Vec<(u16, u64)>,
    /// The requests' durations; empty for streams.
    pub duration: DurationHistogram,
}

/// Requests by command and status code, and their durations by command.
pub struct RequestTable {
    codes: Vec<[u64; STATUS_SLOTS]>,
    durations: Vec<DurationHistogram>,
    /// Every request counted, of every command.
    total: u64,
}

impl RequestTable {
    pub fn new() -> RequestTable {
        RequestTable {
            codes: vec![[0; STATUS_SLOTS]; COMMAND_CODES_COUNTED],
            durations: vec![DurationHistogram::default(); COMMAND_CODES_COUNTED],
            total: 0,
        }
    }

    /// Counts a request of `command` answered with `code` after `duration` (`None`: a
    /// stream, not timed).
    pub fn record(&mut self, command: u16, code: u16, duration: Option<Duration>) {
        let command = (command as usize).min(COMMAND_CODES_COUNTED - 1);
        self.codes[command][status_slot(code)] += 1;
        self.total += 1;
        if let Some(duration) = duration {
            self.durations[command].record(duration);
        }
    }

    /// The figures of the commands answered so far.
    pub fn snapshot(&self) -> Vec<CommandFigures> {
        (0..COMMAND_CODES_COUNTED)
            .filter(|command| self.codes[*command].iter().any(|count| *count > 0))
            .map(|command| CommandFigures {
                command: command as u16,
                codes: (0..STATUS_SLOTS)
                    .filter(|slot| self.codes[command][*slot] > 0)
                    .map(|slot| (status_of_slot(slot), self.codes[command][slot]))
                    .collect(),
                duration: self.durations[command].clone(),
            })
            .collect()
    }
}

impl Default for RequestTable {
    fn default() -> RequestTable {
        RequestTable::new()
    }
}

thread_local! {
    static TABLE: RefCell<RequestTable> = RefCell::new(RequestTable::new());
}

/// The slot of a status code: gRPC's 0 to 16 as themselves, Ringpost's 100 and 101 after.
fn status_slot(code: u16) -> usize {
    match code {
        0..=16 => code as usize,
        100 => 17,
        101 => 18,
        _ => STATUS_SLOTS - 1,
    }
}

fn status_of_slot(slot: usize) -> u16 {
    match slot {
        0..=16 => slot as u16,
        17 => 100,
        18 => 101,
        _ => u16::MAX,
    }
}

/// Counts on this shard a request of `command` answered with `code` after `duration` (`None`:
/// a stream, not timed).
pub fn record(command: u16, code: u16, duration: Option<Duration>) {
    TABLE.with(|table| table.borrow_mut().record(command, code, duration));
}

/// How many requests this shard has counted in all.
pub fn total() -> u64 {
    TABLE.with(|table| table.borrow().total)
}

/// This shard's figures, for the commands it has answered.
pub fn snapshot() -> Vec<CommandFigures> {
    TABLE.with(|table| table.borrow().snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_command_code_and_duration() {
        record(6, 0, Some(Duration::from_micros(40)));
        record(6, 0, Some(Duration::from_micros(51)));
        record(6, 5, Some(Duration::from_secs(1000)));
        record(9, 100, None);
        let figures = snapshot();
        let publish = figures.iter().find(|figures| figures.command == 6).unwrap();
        assert_eq!(publish.codes, vec![(0, 2), (5, 1)]);
        assert_eq!(publish.duration.buckets[0], 1);
        assert_eq!(publish.duration.buckets[1], 1);
        assert_eq!(*publish.duration.buckets.last().unwrap(), 1);
        assert_eq!(publish.duration.sum_us, 1_000_000_091);
        let stream = figures.iter().find(|figures| figures.command == 9).unwrap();
        assert_eq!(stream.codes, vec![(100, 1)]);
        assert!(stream.duration.buckets.is_empty());
    }
}
