//! Seeded simulations (docs/TESTING.md): a log on SimDisk under the deterministic executor,
//! with appends of random batches from several tasks, reads, crashes at random moments that
//! lose (or keep, or tear) unsynced writes, restarts, and disk faults drawn from the seed within
//! what the log tolerates. After every restart, every acknowledged record is there, at its
//! offset, with its bytes; batches are whole; nothing is there that was never appended.
//!
//! `RINGPOST_SIM_SEEDS=N` runs N seeds (200 by default); `RINGPOST_SIM_SEED=S` replays seed S
//! exactly. A failure prints its seed and the command that replays it.

use ringpost_daemon::ids::Offset;
use ringpost_daemon::log::directories::Directories;
use ringpost_daemon::log::{record, Log, LogConfig, LogError, StoredRecord};
use ringpost_daemon::runtime::{self, sim};
use ringpost_daemon::storage::sim::{CrashMode, FaultPlan, SimDisk};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// Seeds a plain `cargo test` runs: enough to meet most interleavings and faults, few enough
/// to take seconds in a debug build.
const SEEDS_DEFAULT: u64 = 200;
/// Lives of the log per seed: each but the last ends in a crash.
const LIVES_MAX: u64 = 4;
/// Tasks appending at once.
const APPENDERS_MAX: u64 = 4;
/// Appends each appender tries per life.
const APPENDS_PER_LIFE_MAX: u64 = 12;
/// Records in one append.
const BATCH_RECORDS_MAX: u64 = 16;
/// Bytes of one record's payload beyond its name.
const PAYLOAD_FILL_MAX: u64 = 1500;
/// How long a life may last before its crash, in virtual time.
const LIFE_MAX: Duration = Duration::from_millis(40);
/// Times an appender retries an append the log turned away for being full or busy.
const RETRIES_MAX: u32 = 3;

/// A live reader pauses between these before it reads the log again.
const READ_PAUSE_MIN: Duration = Duration::from_millis(1);
const READ_PAUSE_MAX: Duration = Duration::from_millis(10);
const RELATIVE: &str = "topics/1";

/// Where a payload came from: its batch, its place in it, and the batch's length.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Origin {
    batch: u64,
    index: u64,
    length: u64,
}

/// What the simulation knows: every payload appended, and what was acknowledged where.
#[derive(Default)]
struct Model {
    /// Payloads by (batch, index), which each payload begins with (see `origin_of`).
    appended: HashMap<(u64, u64), (Origin, Vec<u8>)>,
    acknowledged: BTreeMap<u64, Vec<u8>>,
    next_batch: u64,
    appends_acknowledged: u64,
    appends_failed: u64,
    /// Copies recovery fenced because a read (or its zeroing) failed in them.
    copies_fenced_at_open: u64,
}

fn config(rng: &mut sim::Rng) -> LogConfig {
    LogConfig {
        segment_bytes_initial: 32 * 1024,
        segment_bytes_max: if rng.chance(500_000) { 32 * 1024 } else { 128 * 1024 },
        group_commit_bytes_max: [8 * 1024, 32 * 1024][rng.below(2) as usize],
        tail_cache_bytes_max: [0, 64 * 1024][rng.below(2) as usize],
        tail_cache_budget: None,
        staging_bytes_max: 1 << 20,
        keep_files_open: rng.chance(800_000),
        read_ahead: rng.chance(500_000),
        prewrite: false,
        recycle: false,
        reserve: false,
    }
}

fn crash_mode(rng: &mut sim::Rng) -> CrashMode {
    match rng.below(4) {
        0 => CrashMode::DropUnsynced,
        1 => CrashMode::KeepUnsynced,
        2 => CrashMode::TearLastWrite { sectors: rng.below(8) as usize },
        _ => CrashMode::KeepEach { seed: rng.next_u64() },
    }
}

impl Model {
    /// Where a stored payload came from, if it is one that was appended: payloads begin with
    /// their batch and index, so that a lookup hashes 16 bytes, not the payload.
    fn origin_of(&self, data: &[u8]) -> Option<Origin> {
        let key =
            |range: std::ops::Range<usize>| u64::from_le_bytes(data.get(range)?.try_into().ok()?).into();
        let batch: Option<u64> = key(0..8);
        let index: Option<u64> = key(8..16);
        let (origin, payload) = self.appended.get(&(batch?, index?))?;
        (payload.as_slice() == data).then_some(*origin)
    }
}

/// Checks what a restarted log holds against the model.
fn check(seed: u64, life: u64, records: &[StoredRecord], model: &Model) {
    let context = |offset: u64| format!("seed {seed}, life {life}, offset {offset}");
    for (position, record) in records.iter().enumerate() {
        assert_eq!(
            record.offset.get(),
            position as u64,
            "{}: offsets are not contiguous from 0",
            context(record.offset.get())
        );
        let origin = model
            .origin_of(&record.data)
            .unwrap_or_else(|| panic!("{}: a record that was never appended", context(record.offset.get())));
        if let Some(acknowledged) = model.acknowledged.get(&record.offset.get()) {
            assert_eq!(
                &record.data,
                acknowledged,
                "{}: not the acknowledged record",
                context(record.offset.get())
            );
        }
        // A batch is whole or absent: its records follow each other in order.
        if origin.index > 0 {
            let previous =
                position.checked_sub(1).and_then(|previous| model.origin_of(&records[previous].data));
            let expected = Origin { index: origin.index - 1, ..origin };
            assert_eq!(
                previous,
                Some(expected),
                "{}: a batch cut at its start",
                context(record.offset.get())
            );
        }
        if origin.index + 1 < origin.length {
            let next = records.get(position + 1).and_then(|next| model.origin_of(&next.data));
            let expected = Origin { index: origin.index + 1, ..origin };
            assert_eq!(next, Some(expected), "{}: a batch cut at its end", context(record.offset.get()));
        }
    }
    if let Some((&last, _)) = model.acknowledged.last_key_value() {
        assert!(
            last < records.len() as u64,
            "seed {seed}, life {life}: acknowledged offset {last} is lost ({} records recovered)",
            records.len()
        );
    }
}

/// One appender: random batches until its appends run out, the log refuses for good, or the
/// crash ends it. An acknowledgement is recorded in the poll that receives it, so a crash
/// cannot fall between the two.
async fn append(log: Log<SimDisk>, model: Rc<RefCell<Model>>, mut rng: sim::Rng, name: String) {
    for _ in 0..rng.below(APPENDS_PER_LIFE_MAX + 1) {
        let length = rng.between(1..BATCH_RECORDS_MAX + 1);
        let batch = {
            let mut model = model.borrow_mut();
            model.next_batch += 1;
            model.next_batch
        };
        let mut payloads = Vec::new();
        let mut records = Vec::new();
        for index in 0..length {
            let mut payload = [batch.to_le_bytes(), index.to_le_bytes()].concat();
            payload.extend_from_slice(format!("{name}/batch-{batch}/record-{index}/").as_bytes());
            let fill = rng.below(PAYLOAD_FILL_MAX + 1) as usize;
            payload.extend(std::iter::repeat_n(b'a' + (batch % 26) as u8, fill));
            record::encode_record_unsealed(
                &mut records,
                runtime::wall_ms(),
                &payload,
                &mut std::iter::empty(),
                "",
            );
            model
                .borrow_mut()
                .appended
                .insert((batch, index), (Origin { batch, index, length }, payload.clone()));
            payloads.push(payload);
        }
        let mut retries = 0;
        loop {
            match log.append(records.clone(), length as u32).await {
                Ok((offset, count)) => {
                    assert_eq!(u64::from(count), length);
                    let mut model = model.borrow_mut();
                    model.appends_acknowledged += 1;
                    for (index, payload) in payloads.iter().enumerate() {
                        model.acknowledged.insert(offset.get() + index as u64, payload.clone());
                    }
                    break;
                }
                Err(LogError::NoSpace(_) | LogError::Overloaded) if retries < RETRIES_MAX => {
                    retries += 1;
                    runtime::sleep(Duration::from_millis(1)).await;
                }
                Err(_) => {
                    model.borrow_mut().appends_failed += 1;
                    return;
                }
            }
        }
        if rng.chance(300_000) {
            runtime::sleep(Duration::from_micros(rng.below(2_000))).await;
        }
    }
}

/// A reader going through the log while it is written: what it reads was appended, in order.
async fn read(log: Log<SimDisk>, model: Rc<RefCell<Model>>, mut rng: sim::Rng) {
    loop {
        runtime::sleep(Duration::from_micros(
            rng.between(READ_PAUSE_MIN.as_micros() as u64..READ_PAUSE_MAX.as_micros() as u64),
        ))
        .await;
        let Ok(records) = log.read(Offset::ZERO, usize::MAX, usize::MAX).await else { continue };
        let model = model.borrow();
        for (position, record) in records.iter().enumerate() {
            assert_eq!(record.offset.get(), position as u64, "a live read skipped or repeated an offset");
            assert!(model.origin_of(&record.data).is_some(), "a live read returned a phantom");
            if let Some(acknowledged) = model.acknowledged.get(&record.offset.get()) {
                assert_eq!(&record.data, acknowledged, "a live read returned another record");
            }
        }
    }
}

/// Opens the log as a restarted daemon would, and reads it whole. The faults are confined to
/// at most ⌊M/2⌋ of the M directories, so the open must succeed: a read failing in a faulty
/// copy fences that copy and recovery goes on from the others. A refused open is a failure.
async fn restart(
    disk: &SimDisk,
    paths: &[PathBuf],
    config: &Rc<LogConfig>,
    seed: u64,
    life: u64,
    model: &Rc<RefCell<Model>>,
) -> (Log<SimDisk>, Vec<StoredRecord>) {
    let directories = Directories::new(paths.to_vec());
    let (log, report) = Log::open(disk.clone(), directories, Path::new(RELATIVE), 1, config.clone())
        .await
        .unwrap_or_else(|error| {
            panic!("seed {seed}, life {life}: the log does not open within the fault budget: {error}")
        });
    model.borrow_mut().copies_fenced_at_open += report.copies_fenced.len() as u64;
    let records = log
        .read(Offset::ZERO, usize::MAX, usize::MAX)
        .await
        .unwrap_or_else(|error| panic!("seed {seed}, life {life}: the log opens but does not read: {error}"));
    (log, records)
}

/// What the seeds did, summed: appends acknowledged and refused, faults injected, copies
/// recovery fenced.
#[derive(Default, Debug)]
struct Totals {
    acknowledged: u64,
    refused: u64,
    faults: u64,
    copies_fenced_at_open: u64,
    /// A digest of what the last life recovered and of the virtual time the run took, which
    /// two runs of one seed must agree on.
    digest: u64,
}

/// FNV-1a, over the recovered records' offsets and bytes.
fn digest(records: &[StoredRecord], elapsed: Duration) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |bytes: &[u8]| {
        for byte in bytes {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for record in records {
        mix(&record.offset.get().to_le_bytes());
        mix(&record.data);
    }
    mix(&elapsed.as_nanos().to_le_bytes());
    hash
}

/// Runs one seed.
fn simulate_log(seed: u64) -> Totals {
    let mut rng = sim::Rng::new(seed);
    let copies = [1, 3][rng.below(2) as usize];
    let paths: Vec<PathBuf> = (0..copies).map(|copy| PathBuf::from(format!("/d{copy}"))).collect();
    let disk = SimDisk::new();
    let plan = FaultPlan::draw(&mut rng, &paths);
    disk.set_fault_plan(Some(plan), rng.next_u64());
    let config = Rc::new(config(&mut rng));
    let lives = rng.between(2..LIVES_MAX + 1);
    let model = Rc::new(RefCell::new(Model::default()));
    let mut workload = rng.fork();
    sim::run(seed, async move {
        let started = runtime::now();
        let mut recovered = Vec::new();
        for life in 0..lives {
            let (log, records) = restart(&disk, &paths, &config, seed, life, &model).await;
            check(seed, life, &records, &model.borrow());
            if life + 1 == lives {
                recovered = records;
                break;
            }
            let appenders = workload.between(1..APPENDERS_MAX + 1);
            let mut tasks = Vec::new();
            for appender in 0..appenders {
                let name = format!("life-{life}/appender-{appender}");
                tasks.push(runtime::spawn(append(log.clone(), model.clone(), workload.fork(), name)));
            }
            runtime::spawn(read(log.clone(), model.clone(), workload.fork())).detach();
            // The crash comes at a random moment: sometimes before the appenders are done.
            let life_time = Duration::from_micros(workload.below(LIFE_MAX.as_micros() as u64));
            runtime::sleep(life_time).await;
            sim::kill_spawned_tasks();
            drop(tasks);
            drop(log);
            disk.crash(crash_mode(&mut workload));
        }
        let model = model.borrow();
        // Keeps the workload honest: a seed that acknowledges nothing checks nothing.
        Totals {
            acknowledged: model.appends_acknowledged,
            refused: model.appends_failed,
            faults: disk.planned_fault_count(),
            copies_fenced_at_open: model.copies_fenced_at_open,
            digest: digest(&recovered, runtime::now() - started),
        }
    })
}

#[test]
fn log_survives_crashes_and_faults() {
    let totals = RefCell::new(Totals::default());
    let started = std::time::Instant::now();
    sim::for_each_seed("log_survives_crashes_and_faults", SEEDS_DEFAULT, |seed| {
        let seed_totals = simulate_log(seed);
        let mut totals = totals.borrow_mut();
        totals.acknowledged += seed_totals.acknowledged;
        totals.refused += seed_totals.refused;
        totals.faults += seed_totals.faults;
        totals.copies_fenced_at_open += seed_totals.copies_fenced_at_open;
        totals.digest ^= seed_totals.digest;
    });
    let totals = totals.into_inner();
    eprintln!("log simulation: {totals:?} in {:?}", started.elapsed());
    let acknowledged = totals.acknowledged;
    assert!(acknowledged > 0, "the simulation acknowledged nothing, so it checked nothing");
}

/// A seed replays exactly: the same interleaving, faults and crashes, so the same records in
/// the end, after the same virtual time.
#[test]
fn a_log_simulation_replays_its_seed() {
    for seed in [3, 61, 1106] {
        assert_eq!(format!("{:?}", simulate_log(seed)), format!("{:?}", simulate_log(seed)), "seed {seed}");
    }
}
