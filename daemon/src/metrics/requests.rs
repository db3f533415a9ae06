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

/// Commands are counted by code below this; larger codes share the last slot.
pub const COMMAND_CODES_COUNTED: usize = 128;
/// Status codes are counted by number below this (the gRPC codes and Ringpost's own, 100 and
/// 101, folded into 17 and 18); others share the last slot.
pub const STATUS_SLOTS: usize = 20;
/// Upper bounds of the duration buckets, in microseconds: 50 µs doubling to about 26 s, then
/// everything longer.
pub const DURATION_BUCKETS_US: [u64; 20] = {
    let mut bounds = [0u64; 20];
    let mut index = 0;
    while index < 20 {
        bounds[index] = 50 << index;
        index += 1;
    }
    bounds
};

/// One command's figures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandFigures {
    pub command: u16,
    /// (status code, requests answered with it), the codes seen only.
    pub codes: Vec<(u16, u64)>,
    /// Requests per duration bucket (`DURATION_BUCKETS_US`, then one for longer), and the
    /// sum of their durations; empty for streams.
    pub duration_buckets: Vec<u64>,
    pub duration_sum_us: u64,
}

struct Table {
    codes: Vec<[u64; STATUS_SLOTS]>,
    buckets: Vec<[u64; DURATION_BUCKETS_US.len() + 1]>,
    sums_us: Vec<u64>,
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::new(Table {
        codes: vec![[0; STATUS_SLOTS]; COMMAND_CODES_COUNTED],
        buckets: vec![[0; DURATION_BUCKETS_US.len() + 1]; COMMAND_CODES_COUNTED],
        sums_us: vec![0; COMMAND_CODES_COUNTED],
    });
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

/// Counts a request of `command` answered with `code` after `duration` (`None`: a stream,
/// not timed).
pub fn record(command: u16, code: u16, duration: Option<Duration>) {
    let command = (command as usize).min(COMMAND_CODES_COUNTED - 1);
    TABLE.with(|table| {
        let mut table = table.borrow_mut();
        table.codes[command][status_slot(code)] += 1;
        if let Some(duration) = duration {
            let micros = duration.as_micros().min(u64::MAX as u128) as u64;
            let bucket = DURATION_BUCKETS_US
                .iter()
                .position(|bound| micros <= *bound)
                .unwrap_or(DURATION_BUCKETS_US.len());
            table.buckets[command][bucket] += 1;
            table.sums_us[command] = table.sums_us[command].saturating_add(micros);
        }
    });
}

/// This shard's figures, for the commands it has answered.
pub fn snapshot() -> Vec<CommandFigures> {
    TABLE.with(|table| {
        let table = table.borrow();
        (0..COMMAND_CODES_COUNTED)
            .filter(|command| table.codes[*command].iter().any(|count| *count > 0))
            .map(|command| {
                let timed = table.buckets[command].iter().any(|count| *count > 0);
                CommandFigures {
                    command: command as u16,
                    codes: (0..STATUS_SLOTS)
                        .filter(|slot| table.codes[command][*slot] > 0)
                        .map(|slot| (status_of_slot(slot), table.codes[command][slot]))
                        .collect(),
                    duration_buckets: if timed { table.buckets[command].to_vec() } else { Vec::new() },
                    duration_sum_us: table.sums_us[command],
                }
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_command_code_and_duration() {
        record(6, 0, Some(Duration::from_micros(40)));
        record(6, 0, Some(Duration::from_micros(51)));
        record(6, 5, Some(Duration::from_secs(100)));
        record(9, 100, None);
        let figures = snapshot();
        let publish = figures.iter().find(|figures| figures.command == 6).unwrap();
        assert_eq!(publish.codes, vec![(0, 2), (5, 1)]);
        assert_eq!(publish.duration_buckets[0], 1);
        assert_eq!(publish.duration_buckets[1], 1);
        assert_eq!(*publish.duration_buckets.last().unwrap(), 1);
        assert_eq!(publish.duration_sum_us, 100_000_091);
        let stream = figures.iter().find(|figures| figures.command == 9).unwrap();
        assert_eq!(stream.codes, vec![(100, 1)]);
        assert!(stream.duration_buckets.is_empty());
        assert_eq!(DURATION_BUCKETS_US[19], 50 << 19);
    }
}
