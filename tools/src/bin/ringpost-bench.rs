//! `ringpost-bench`: the load generator. See `ringpost_tools::bench` for the workloads.

use argh::FromArgs;
use ringpost_tools::bench::embedded::EmbeddedDaemon;
use ringpost_tools::bench::format::{parse_byte_list, parse_bytes, thousands};
use ringpost_tools::bench::publish::{self, PublishOptions};
use ringpost_tools::bench::Failure;
use ringpost_tools::disk::{self, DiskOptions, DiskResult};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

const SERVER_DEFAULT: &str = "127.0.0.1:7450";

/// Ringpost's load generator: durable publish throughput and latency against a daemon, or the
/// durable-write ceiling of a disk.
#[derive(FromArgs)]
#[argh(
    example = "Measure an in-process daemon on a scratch directory under /var/tmp:\n  $ {command_name} --embedded publish --json /tmp/out.json",
    example = "Offer 10,000 msg/s open loop to a running daemon:\n  $ {command_name} --server 127.0.0.1:7450 publish --rate 10000 --messages 50000",
    example = "Measure the disk the daemon would write to:\n  $ {command_name} --data-dir /var/tmp disk --json /tmp/disk.json",
    note = "Progress goes to stderr once a second, results to stdout. Ctrl-C stops a publish run early and still reports what completed; a second Ctrl-C kills it.",
    error_code(1, "the run failed, or some messages failed (the results are still printed)"),
    error_code(2, "invalid arguments"),
    error_code(3, "the server cannot be reached")
)]
struct Flags {
    /// router address of the daemon to load (default 127.0.0.1:7450, or $RINGPOST_SERVER)
    #[argh(option, arg_name = "addr")]
    server: Option<String>,
    /// start a daemon inside this process, on ephemeral loopback ports, and load it; its data
    /// directory is --data-dir (kept) or a fresh one under /var/tmp (removed at exit)
    #[argh(switch)]
    embedded: bool,
    /// data directory of the embedded daemon, or the directory whose disk the disk workload
    /// measures (default: the current directory)
    #[argh(option, arg_name = "dir")]
    data_dir: Option<PathBuf>,
    #[argh(subcommand)]
    workload: Workload,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum Workload {
    Publish(PublishFlags),
    Disk(DiskFlags),
}

/// publish only (workload W1): publishers keep batches in flight; reports msgs/s, MB/s and
/// publish-ack latency
#[derive(FromArgs)]
#[argh(subcommand, name = "publish")]
struct PublishFlags {
    /// messages to publish in all (default 200000)
    #[argh(option, default = "publish::MESSAGES_DEFAULT")]
    messages: u64,
    /// payload bytes per message (default 1024)
    #[argh(option, arg_name = "bytes", default = "publish::SIZE_BYTES_DEFAULT")]
    size: usize,
    /// publisher threads, each with its own client and connections (default 4)
    #[argh(option, default = "publish::PUBLISHERS_DEFAULT")]
    publishers: usize,
    /// messages per publish request, 1 to 1000 (default 100)
    #[argh(option, default = "publish::BATCH_DEFAULT")]
    batch: usize,
    /// publish requests in flight per publisher (default 8)
    #[argh(option, default = "publish::INFLIGHT_DEFAULT")]
    inflight: usize,
    /// existing topic to publish to (default: a fresh topic bench-<pid>-<nanos>, deleted after
    /// the run)
    #[argh(option)]
    topic: Option<String>,
    /// open loop: offer this many messages per second in all, at fixed intervals, and measure
    /// latency from each request's scheduled send time (default: closed loop, as fast as acks
    /// come back)
    #[argh(option, arg_name = "msgs-per-sec")]
    rate: Option<f64>,
    /// also write the results as one JSON object to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
}

/// the disk's durable-write ceiling: O_DIRECT writes each followed by fdatasync, as the daemon
/// does, in the directory given by --data-dir
#[derive(FromArgs)]
#[argh(subcommand, name = "disk")]
struct DiskFlags {
    /// write sizes to measure, comma-separated, multiples of 4096; KiB, MiB, GiB suffixes are
    /// accepted (default 4096,65536,1048576)
    #[argh(option, arg_name = "sizes", from_str_fn(parse_byte_list))]
    block_sizes: Option<Vec<usize>>,
    /// bytes to write per size, at most 10 s each (default 256MiB)
    #[argh(option, arg_name = "bytes", from_str_fn(parse_bytes))]
    bytes_per_size: Option<u64>,
    /// also write the results as JSON to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
}

/// Set by the first Ctrl-C; publishers stop sending and drain what is in flight.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: nix::libc::c_int) {
    // Only an atomic store: nothing else is async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// Ends a publish run early but orderly on Ctrl-C, so the results so far are printed and the
/// scratch data directory is removed. SA_RESETHAND restores the default action, so a second
/// Ctrl-C kills the process if draining hangs.
fn stop_on_interrupt() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_interrupt), SaFlags::SA_RESETHAND, SigSet::empty());
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    if let Err(error) = unsafe { sigaction(Signal::SIGINT, &action) } {
        eprintln!("warning: Ctrl-C will not stop the run cleanly: {error}");
    }
}

fn main() -> ExitCode {
    let flags: Flags = argh::from_env();
    match run(flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{}", failure.message);
            ExitCode::from(failure.exit_code)
        }
    }
}

fn run(flags: Flags) -> Result<(), Failure> {
    if flags.server.is_some() && flags.embedded {
        return Err(Failure::usage(
            "InvalidArgument: --server and --embedded exclude each other: load a running daemon, or start one",
        ));
    }
    match flags.workload {
        Workload::Publish(publish) => {
            if flags.data_dir.is_some() && !flags.embedded {
                return Err(Failure::usage(
                    "InvalidArgument: --data-dir applies to publish only with --embedded; a running daemon has its own",
                ));
            }
            let mut options = PublishOptions {
                server: String::new(),
                topic: publish.topic,
                messages: publish.messages,
                size_bytes: publish.size,
                publishers: publish.publishers,
                batch: publish.batch,
                inflight: publish.inflight,
                rate_per_sec: publish.rate,
            };
            // Refuse a bad command line before starting a daemon for it.
            options.validate()?;
            // The daemon lives until this function returns, and its scratch directory with it.
            let embedded = match flags.embedded {
                true => Some(EmbeddedDaemon::start(flags.data_dir.as_deref())?),
                false => None,
            };
            options.server = match &embedded {
                Some(daemon) => {
                    let kept = if daemon.is_scratch() { "removed at exit" } else { "kept" };
                    eprintln!(
                        "embedded daemon at {} (data directory {}, {kept})",
                        daemon.address,
                        daemon.data_dir.display()
                    );
                    daemon.address.clone()
                }
                None => flags
                    .server
                    .or_else(|| std::env::var("RINGPOST_SERVER").ok())
                    .unwrap_or_else(|| SERVER_DEFAULT.to_owned()),
            };
            run_publish(&options, publish.json.as_deref())
        }
        Workload::Disk(disk) => {
            if flags.server.is_some() || flags.embedded {
                return Err(Failure::usage(
                    "InvalidArgument: the disk workload measures a directory, not a daemon: leave out --server and --embedded",
                ));
            }
            run_disk(flags.data_dir.unwrap_or_else(|| PathBuf::from(".")), disk)
        }
    }
}

fn run_publish(options: &PublishOptions, json_path: Option<&Path>) -> Result<(), Failure> {
    stop_on_interrupt();
    let report = publish::run(options, &STOP, &mut |progress| eprintln!("{}", progress.line()))?;
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    print!("{}", report.table(options));
    if let Some(path) = json_path {
        write_json(path, &report.json(options))?;
    }
    if STOP.load(Ordering::Relaxed) {
        return Err(Failure::runtime(format!(
            "interrupted: {} of {} messages were sent",
            thousands(report.messages()),
            thousands(options.messages)
        )));
    }
    if report.messages_failed > 0 {
        return Err(Failure::runtime(format!(
            "{} of {} messages failed; the first error: {}",
            thousands(report.messages_failed),
            thousands(report.messages()),
            report.first_error.as_deref().unwrap_or("unknown")
        )));
    }
    Ok(())
}

fn run_disk(data_dir: PathBuf, flags: DiskFlags) -> Result<(), Failure> {
    let defaults = DiskOptions::default();
    let options = DiskOptions {
        data_dir,
        block_sizes: flags.block_sizes.unwrap_or(defaults.block_sizes.clone()),
        bytes_per_size: flags.bytes_per_size.unwrap_or(defaults.bytes_per_size),
        ..defaults
    };
    let results = disk::measure(&options, &mut |line| eprintln!("{line}")).map_err(|error| {
        match (error.kind(), error.raw_os_error()) {
            // The disk module refuses impossible options with InvalidInput and no OS error; an
            // EINVAL from the kernel (O_DIRECT on tmpfs, say) is a run-time failure instead.
            (std::io::ErrorKind::InvalidInput, None) => Failure::usage(format!("InvalidArgument: {error}")),
            _ => Failure::runtime(format!("measuring {}: {error}", options.data_dir.display())),
        }
    })?;
    print!("{}", disk_table(&results));
    println!(
        "measured in {}: O_DIRECT writes, each followed by fdatasync, one at a time",
        options.data_dir.display()
    );
    if let Some(path) = &flags.json {
        write_json(path, &disk::to_json(&results))?;
    }
    Ok(())
}

fn disk_table(results: &[DiskResult]) -> String {
    let header =
        ["block bytes", "MB/s", "writes/s", "sync p50 us", "sync p99 us", "write+sync p99 us", "O_DIRECT"];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|result| {
            vec![
                thousands(result.block_bytes as u64),
                format!("{:.1}", result.mb_per_sec),
                thousands(result.writes_per_sec.round() as u64),
                thousands(result.sync_p50_us),
                thousands(result.sync_p99_us),
                thousands(result.write_sync_p99_us),
                if result.o_direct { "yes" } else { "no (page cache)" }.to_owned(),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|name| name.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:>width$}")).collect();
        format!("{}\n", padded.join("  "))
    };
    let mut out = line(header.iter().map(|name| name.to_string()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    out.push_str(
        "MB/s is 10^6 bytes per second; sync is the fdatasync alone, write+sync what a publisher waits for\n",
    );
    out
}

fn write_json(path: &Path, json: &str) -> Result<(), Failure> {
    std::fs::write(path, format!("{json}\n"))
        .map_err(|error| Failure::runtime(format!("writing {}: {error}", path.display())))
}
