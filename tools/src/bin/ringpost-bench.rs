//! `ringpost-bench`: the load generator. See `ringpost_tools::bench` for the workloads.

use argh::FromArgs;
use ringpost_tools::bench::embedded::EmbeddedDaemon;
use ringpost_tools::bench::format::{json_number, parse_byte_list, parse_bytes, thousands};
use ringpost_tools::bench::publish::{self, PublishOptions};
use ringpost_tools::bench::report::Report;
use ringpost_tools::bench::subscribe::WINDOW_DEFAULT;
use ringpost_tools::bench::workload::{self, Workload, WorkloadOptions};
use ringpost_tools::bench::Failure;
use ringpost_tools::bench::{compare, curve};
use ringpost_tools::cli;
use ringpost_tools::disk::{self, DiskOptions, DiskResult};
use ringpost_tools::errln;
use ringpost_tools::loopback::{self, LoopbackOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// The options `cli::hoist` takes from anywhere on the command line, as `ringpost` does.
const GLOBAL_OPTIONS: [cli::GlobalOption; 8 + cli::SECURITY_OPTIONS.len()] = {
    let mut options =
        [cli::GlobalOption { name: "--server", takes_value: true }; 8 + cli::SECURITY_OPTIONS.len()];
    options[1] = cli::GlobalOption { name: "--embedded", takes_value: false };
    options[2] = cli::GlobalOption { name: "--data-dir", takes_value: true };
    options[3] = cli::GlobalOption { name: "--grpc", takes_value: false };
    options[4] = cli::GlobalOption { name: "--grpc-server", takes_value: true };
    options[5] = cli::GlobalOption { name: "--scrape-every", takes_value: true };
    options[6] = cli::GlobalOption { name: "--rest", takes_value: false };
    options[7] = cli::GlobalOption { name: "--rest-server", takes_value: true };
    let mut index = 0;
    while index < cli::SECURITY_OPTIONS.len() {
        options[8 + index] = cli::SECURITY_OPTIONS[index];
        index += 1;
    }
    options
};

/// The backlog workload stores this many messages before draining them (W5 of the brief).
const BACKLOG_MESSAGES_DEFAULT: u64 = 1_000_000;
/// Requests of the topics workload carry few messages, so that 10,000 topics each get several
/// requests from a run of a few hundred thousand messages.
const TOPICS_BATCH_DEFAULT: usize = 10;

/// Ringpost's load generator: the canonical workloads (publish, end to end, fan-out, many
/// topics, backlog drain) against a daemon, the durable-write ceiling of a disk, and a
/// side-by-side comparison of two result files.
#[derive(FromArgs)]
#[argh(
    example = "Measure an in-process daemon on a scratch directory under /var/tmp:\n  $ {command_name} --embedded publish --json /tmp/out.json",
    example = "Offer 10,000 msg/s open loop to a running daemon:\n  $ {command_name} --server 127.0.0.1:7450 publish --rate 10000 --messages 50000",
    example = "End-to-end latency with one subscription, and its percentile plot:\n  $ {command_name} --embedded e2e --latency-plot /tmp/e2e.svg",
    example = "Ten subscriptions that each receive every message:\n  $ {command_name} --embedded fanout --subscriptions 10",
    example = "Measure the disk the daemon would write to:\n  $ {command_name} --data-dir /var/tmp disk --json /tmp/disk.json",
    example = "Two runs side by side:\n  $ {command_name} compare before.json after.json",
    example = "W1 through Google Cloud Pub/Sub's gRPC API of an in-process daemon:\n  $ {command_name} --embedded --grpc publish",
    note = "--server, --embedded, --data-dir and the security options (--token, --ca, --cert, --key, --server-name) may be given anywhere on the line, before or after the workload.",
    example = "Publish over TLS with a token to a daemon that requires both:\n  $ {command_name} --server 10.0.0.5:7450 --ca ca.pem --token \"$TOKEN\" publish",
    note = "ringpost-bench --version prints its version.",
    note = "Progress goes to stderr once a second, results to stdout. Ctrl-C stops publishing early and still reports what completed (subscribers drain what was acknowledged); a second Ctrl-C kills it.",
    error_code(1, "the server refused a request, the run failed, or some messages failed or were lost (the results are still printed)"),
    error_code(2, "usage: invalid arguments, found before anything was sent"),
    error_code(3, "no Ringpost server answered: cannot connect, the connection failed, a deadline passed, or the port speaks another protocol")
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
    /// publish, stream and acknowledge through Google Cloud Pub/Sub's gRPC API instead of the
    /// native protocol (topics and subscriptions are still made through the router)
    #[argh(switch)]
    grpc: bool,
    /// with --grpc and --server, where the daemon's gRPC API serves (default 127.0.0.1:8085);
    /// an embedded daemon serves it on a free port
    #[argh(option, arg_name = "addr")]
    grpc_server: Option<String>,
    /// publish through Google Cloud Pub/Sub's REST interface (JSON over HTTP/1.1, one
    /// keep-alive connection per request in flight) instead of the native protocol; the
    /// publish workload only
    #[argh(switch)]
    rest: bool,
    /// with --rest and --server, where the daemon's REST interface serves (default
    /// 127.0.0.1:8086); an embedded daemon serves it on a free port
    #[argh(option, arg_name = "addr")]
    rest_server: Option<String>,
    /// with --embedded: serve the daemon's monitoring endpoint and read its /metrics every this
    /// many milliseconds while the workload runs, as Prometheus would (for measuring what a
    /// scrape costs)
    #[argh(option, arg_name = "ms")]
    scrape_every: Option<u64>,
    /// the token to authenticate with, sent first on every connection (default $RINGPOST_TOKEN)
    #[argh(option)]
    token: Option<String>,
    /// PEM file of the CA that signed the daemon's certificate: connect over TLS, trusting
    /// only it (default $RINGPOST_CA; without either, plaintext)
    #[argh(option, arg_name = "file")]
    ca: Option<String>,
    /// PEM file of a client certificate to present (mTLS), with --key (default $RINGPOST_CERT)
    #[argh(option, arg_name = "file")]
    cert: Option<String>,
    /// PEM file of the client certificate's private key (default $RINGPOST_KEY)
    #[argh(option, arg_name = "file")]
    key: Option<String>,
    /// the name the daemon's certificate must hold (default $RINGPOST_SERVER_NAME, else the
    /// host of each address)
    #[argh(option)]
    server_name: Option<String>,
    #[argh(subcommand)]
    workload: Command,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum Command {
    Publish(PublishFlags),
    EndToEnd(EndToEndFlags),
    Fanout(FanoutFlags),
    Topics(TopicsFlags),
    Backlog(BacklogFlags),
    Push(PushFlags),
    Disk(DiskFlags),
    Loopback(LoopbackFlags),
    Curve(CurveFlags),
    Compare(CompareFlags),
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
    /// fresh topics to make and publish to, requests taking turns over them (default 1)
    #[argh(option, default = "1")]
    topics: usize,
    /// publish sources of each fresh topic, one per forwarder shard at most (default 1)
    #[argh(option, default = "1")]
    sources: u32,
    /// open loop: offer this many messages per second in all, at fixed intervals, and measure
    /// latency from each request's scheduled send time (default: closed loop, as fast as acks
    /// come back)
    #[argh(option, arg_name = "msgs-per-sec")]
    rate: Option<f64>,
    /// pin each publisher thread to a core, round robin
    #[argh(switch)]
    pin: bool,
    /// also write the results as one JSON object to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
    /// also draw the latency distribution as a percentile plot to this SVG file
    #[argh(option, arg_name = "path")]
    latency_plot: Option<PathBuf>,
}

/// end to end (W2): the publish workload plus one subscription that consumes and acknowledges
/// concurrently; adds delivery latency (publish start to receipt), lost and duplicate counts
#[derive(FromArgs)]
#[argh(subcommand, name = "e2e")]
struct EndToEndFlags {
    /// messages to publish in all (default 200000)
    #[argh(option, default = "publish::MESSAGES_DEFAULT")]
    messages: u64,
    /// payload bytes per message, at least 8 (default 1024)
    #[argh(option, arg_name = "bytes", default = "publish::SIZE_BYTES_DEFAULT")]
    size: usize,
    /// publisher threads (default 4)
    #[argh(option, default = "publish::PUBLISHERS_DEFAULT")]
    publishers: usize,
    /// messages per publish request, 1 to 1000 (default 100)
    #[argh(option, default = "publish::BATCH_DEFAULT")]
    batch: usize,
    /// publish requests in flight per publisher (default 8)
    #[argh(option, default = "publish::INFLIGHT_DEFAULT")]
    inflight: usize,
    /// open loop: offer this many messages per second in all; both latencies count from the
    /// scheduled send time (default: closed loop)
    #[argh(option, arg_name = "msgs-per-sec")]
    rate: Option<f64>,
    /// messages a stream may have delivered and not acknowledged (default 1000)
    #[argh(option, default = "WINDOW_DEFAULT")]
    window: u64,
    /// pin each publisher and subscriber thread to a core, round robin
    #[argh(switch)]
    pin: bool,
    /// also write the results as one JSON object to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
    /// also draw the latency distributions as a percentile plot to this SVG file
    #[argh(option, arg_name = "path")]
    latency_plot: Option<PathBuf>,
}

/// fan-out (W3): one topic, several subscriptions that each receive every message; reports
/// deliveries/s over all subscriptions
#[derive(FromArgs)]
#[argh(subcommand, name = "fanout")]
struct FanoutFlags {
    /// messages to publish in all (default 200000)
    #[argh(option, default = "publish::MESSAGES_DEFAULT")]
    messages: u64,
    /// subscriptions on the topic (default 10)
    #[argh(option, default = "workload::SUBSCRIPTIONS_DEFAULT")]
    subscriptions: usize,
    /// payload bytes per message, at least 8 (default 1024)
    #[argh(option, arg_name = "bytes", default = "publish::SIZE_BYTES_DEFAULT")]
    size: usize,
    /// publisher threads (default 4)
    #[argh(option, default = "publish::PUBLISHERS_DEFAULT")]
    publishers: usize,
    /// messages per publish request, 1 to 1000 (default 100)
    #[argh(option, default = "publish::BATCH_DEFAULT")]
    batch: usize,
    /// publish requests in flight per publisher (default 8)
    #[argh(option, default = "publish::INFLIGHT_DEFAULT")]
    inflight: usize,
    /// open loop: offer this many messages per second in all (default: closed loop)
    #[argh(option, arg_name = "msgs-per-sec")]
    rate: Option<f64>,
    /// messages a stream may have delivered and not acknowledged (default 1000)
    #[argh(option, default = "WINDOW_DEFAULT")]
    window: u64,
    /// threads the subscriptions' streams are spread over (default 4)
    #[argh(option, default = "workload::FANOUT_SUBSCRIBER_THREADS_DEFAULT")]
    subscriber_threads: usize,
    /// pin each publisher and subscriber thread to a core, round robin
    #[argh(switch)]
    pin: bool,
    /// also write the results as one JSON object to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
    /// also draw the latency distributions as a percentile plot to this SVG file
    #[argh(option, arg_name = "path")]
    latency_plot: Option<PathBuf>,
}

/// many topics (W4): topics with one subscription each, created in parallel, publishes spread
/// evenly over them
#[derive(FromArgs)]
#[argh(subcommand, name = "topics")]
struct TopicsFlags {
    /// topics, each with one subscription (default 10000)
    #[argh(option, default = "workload::TOPICS_DEFAULT")]
    topics: usize,
    /// messages to publish in all (default 200000)
    #[argh(option, default = "publish::MESSAGES_DEFAULT")]
    messages: u64,
    /// payload bytes per message, at least 8 (default 1024)
    #[argh(option, arg_name = "bytes", default = "publish::SIZE_BYTES_DEFAULT")]
    size: usize,
    /// publisher threads (default 4)
    #[argh(option, default = "publish::PUBLISHERS_DEFAULT")]
    publishers: usize,
    /// messages per publish request, each request to the next topic (default 10)
    #[argh(option, default = "TOPICS_BATCH_DEFAULT")]
    batch: usize,
    /// publish requests in flight per publisher (default 8)
    #[argh(option, default = "publish::INFLIGHT_DEFAULT")]
    inflight: usize,
    /// open loop: offer this many messages per second in all (default: closed loop)
    #[argh(option, arg_name = "msgs-per-sec")]
    rate: Option<f64>,
    /// messages a stream may have delivered and not acknowledged (default 1000)
    #[argh(option, default = "WINDOW_DEFAULT")]
    window: u64,
    /// threads the streams are multiplexed over (default 2)
    #[argh(option, default = "workload::TOPICS_SUBSCRIBER_THREADS_DEFAULT")]
    subscriber_threads: usize,
    /// leave the topics idle this long before reading the daemon's resident memory with them
    /// (default 0; 15 lets a forwarder give back what the creation burst freed)
    #[argh(option, default = "0")]
    settle_seconds: u64,
    /// pin each publisher and subscriber thread to a core, round robin
    #[argh(switch)]
    pin: bool,
    /// also write the results as one JSON object to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
    /// also draw the latency distributions as a percentile plot to this SVG file
    #[argh(option, arg_name = "path")]
    latency_plot: Option<PathBuf>,
}

/// backlog (W5): publish all messages first, then drain them with one subscription; reports the
/// drain rate as deliveries/s
#[derive(FromArgs)]
#[argh(subcommand, name = "backlog")]
struct BacklogFlags {
    /// messages to store and then drain (default 1000000)
    #[argh(option, default = "BACKLOG_MESSAGES_DEFAULT")]
    messages: u64,
    /// payload bytes per message, at least 8 (default 1024)
    #[argh(option, arg_name = "bytes", default = "publish::SIZE_BYTES_DEFAULT")]
    size: usize,
    /// publisher threads that fill the backlog (default 4)
    #[argh(option, default = "publish::PUBLISHERS_DEFAULT")]
    publishers: usize,
    /// messages per publish request while filling (default 100)
    #[argh(option, default = "publish::BATCH_DEFAULT")]
    batch: usize,
    /// publish requests in flight per publisher while filling (default 8)
    #[argh(option, default = "publish::INFLIGHT_DEFAULT")]
    inflight: usize,
    /// messages the draining stream may have delivered and not acknowledged (default 1000)
    #[argh(option, default = "WINDOW_DEFAULT")]
    window: u64,
    /// pin each publisher and subscriber thread to a core, round robin
    #[argh(switch)]
    pin: bool,
    /// also write the results as one JSON object to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
    /// also draw the latency distributions as a percentile plot to this SVG file
    #[argh(option, arg_name = "path")]
    latency_plot: Option<PathBuf>,
}

/// push: W2's publishing with its subscription pushed by the daemon to an HTTP receiver in this
/// process that answers 204; reports deliveries/s and push latency (publish start to receipt)
/// beside W2's streaming pull of as many messages, published the same way, in the same run
#[derive(FromArgs)]
#[argh(subcommand, name = "push")]
struct PushFlags {
    /// messages to publish in all, in each half (default 200000)
    #[argh(option, default = "publish::MESSAGES_DEFAULT")]
    messages: u64,
    /// payload bytes per message, at least 8 (default 1024)
    #[argh(option, arg_name = "bytes", default = "publish::SIZE_BYTES_DEFAULT")]
    size: usize,
    /// publisher threads (default 4)
    #[argh(option, default = "publish::PUBLISHERS_DEFAULT")]
    publishers: usize,
    /// messages per publish request, 1 to 1000 (default 100)
    #[argh(option, default = "publish::BATCH_DEFAULT")]
    batch: usize,
    /// publish requests in flight per publisher (default 8)
    #[argh(option, default = "publish::INFLIGHT_DEFAULT")]
    inflight: usize,
    /// open loop: offer this many messages per second in all (default: closed loop)
    #[argh(option, arg_name = "msgs-per-sec")]
    rate: Option<f64>,
    /// messages W2's stream may have delivered and not acknowledged (default 1000; the push
    /// window is the daemon's)
    #[argh(option, default = "WINDOW_DEFAULT")]
    window: u64,
    /// the address the receiver listens on, where the daemon reaches this process (default
    /// 127.0.0.1)
    #[argh(option, arg_name = "addr", default = "workload::RECEIVER_HOST_DEFAULT.to_owned()")]
    receiver_host: String,
    /// the push half alone, without W2's streaming pull before it
    #[argh(switch)]
    push_only: bool,
    /// pin each publisher and subscriber thread to a core, round robin
    #[argh(switch)]
    pin: bool,
    /// also write the results as one JSON object to this file (W2's under "pull")
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
    /// also draw the push's latency distributions as a percentile plot to this SVG file
    #[argh(option, arg_name = "path")]
    latency_plot: Option<PathBuf>,
}

/// the disk's ceilings in the directory given by --data-dir: O_DIRECT writes each followed by
/// fdatasync, as the daemon commits, or (--read) sequential O_DIRECT reads, as it drains a backlog
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
    /// write into space that is only fallocated, each block once, as a growing log does,
    /// instead of over written blocks (the disk's best case)
    #[argh(switch)]
    fresh: bool,
    /// measure reads instead: a file of --bytes-per-size is written, then read once from start
    /// to end with O_DIRECT, as a subscriber draining a backlog reads the log
    #[argh(switch)]
    read: bool,
    /// writes (each with its fdatasync) or reads kept in flight at once (default 1; the daemon
    /// reads a backlog up to 3 read-ahead extents ahead)
    #[argh(option, default = "1")]
    in_flight: usize,
    /// also write the results as JSON to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
}

/// the loopback TCP ceiling: bytes per second over 127.0.0.1 connections with nothing else
/// running, the bound on what a load generator on this machine can measure
#[derive(FromArgs)]
#[argh(subcommand, name = "loopback")]
struct LoopbackFlags {
    /// connection counts to measure, comma-separated (default 1,4)
    #[argh(option, arg_name = "counts", from_str_fn(parse_count_list))]
    connections: Option<Vec<usize>>,
    /// bytes to send over each connection (default 1GiB)
    #[argh(option, arg_name = "bytes", from_str_fn(parse_bytes))]
    bytes: Option<u64>,
    /// measure request round trips instead: this many requests per connection, each answered
    /// by a server that does nothing (the ceiling of one message per request)
    #[argh(option)]
    requests: Option<u64>,
    /// with --requests: requests unanswered per connection at most (default 64)
    #[argh(option, default = "64")]
    in_flight: usize,
    /// with --requests: bytes of each request, its 4-byte length included (default 1100, a
    /// publish of one 1 KiB message)
    #[argh(option, default = "1100")]
    request_bytes: usize,
    /// with --requests: bytes of each answer, its 4-byte length included (default 64)
    #[argh(option, default = "64")]
    response_bytes: usize,
    /// also write the results as JSON to this file
    #[argh(option, arg_name = "path")]
    json: Option<PathBuf>,
}

/// one scaling chart from result files: a line per --y field against the --x field, drawn as
/// SVG and printed as a Markdown table
#[derive(FromArgs)]
#[argh(
    subcommand,
    name = "curve",
    example = "MB/s versus message size, beside the disk's ceiling:\n  $ {command_name} --title 'Publish' --x size --y mb_per_sec=MB/s --y-label MB/s --x-log --ceiling 'disk=2900' --svg size.svg size_*.json"
)]
struct CurveFlags {
    /// the chart's title
    #[argh(option)]
    title: String,
    /// field of each file for the x axis, a dotted path such as size or publishers
    #[argh(option)]
    x: String,
    /// the x axis label (default: the field)
    #[argh(option)]
    x_label: Option<String>,
    /// field for one line, PATH or PATH=NAME, such as publish_ack_us.p99=ack p99; repeatable
    #[argh(option)]
    y: Vec<String>,
    /// the y axis label
    #[argh(option)]
    y_label: String,
    /// a horizontal reference line, NAME=VALUE; repeatable
    #[argh(option)]
    ceiling: Vec<String>,
    /// logarithmic x axis
    #[argh(switch)]
    x_log: bool,
    /// logarithmic y axis
    #[argh(switch)]
    y_log: bool,
    /// write the chart to this SVG file
    #[argh(option, arg_name = "path")]
    svg: Option<PathBuf>,
    /// result files (--json of any workload), one point each
    #[argh(positional)]
    files: Vec<PathBuf>,
}

fn parse_count_list(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(|count| match count.trim().parse::<usize>() {
            Ok(count) if count > 0 => Ok(count),
            _ => Err(format!("'{count}' is not a count above 0")),
        })
        .collect()
}

/// two result files (--json of any workload) side by side, with the ratio of every figure
#[derive(FromArgs)]
#[argh(subcommand, name = "compare")]
struct CompareFlags {
    /// the first run (A)
    #[argh(positional)]
    first: PathBuf,
    /// the second run (B)
    #[argh(positional)]
    second: PathBuf,
}

/// Builds `LoadFlags` from a load subcommand's shared flags: argh cannot flatten one flag struct
/// into several subcommands, so each declares them and this reads them in one place.
macro_rules! load_flags {
    ($workload:expr, $flags:ident, $rate:expr) => {
        LoadFlags::new(
            $workload,
            $flags.messages,
            $flags.size,
            $flags.publishers,
            $flags.batch,
            $flags.inflight,
            $rate,
            $flags.pin,
            $flags.json,
            $flags.latency_plot,
        )
    };
}

/// The options every load workload shares, whichever subcommand they came from.
struct LoadFlags {
    options: WorkloadOptions,
    json: Option<PathBuf>,
    latency_plot: Option<PathBuf>,
    /// Push workload: W2's streaming pull of as many messages first, for the ratio.
    pull_beside: bool,
}

impl LoadFlags {
    #[allow(clippy::too_many_arguments)]
    fn new(
        workload: Workload,
        messages: u64,
        size: usize,
        publishers: usize,
        batch: usize,
        inflight: usize,
        rate: Option<f64>,
        pin: bool,
        json: Option<PathBuf>,
        latency_plot: Option<PathBuf>,
    ) -> LoadFlags {
        let publish = PublishOptions {
            server: String::new(),
            topic: None,
            messages,
            size_bytes: size,
            publishers,
            batch,
            inflight,
            rate_per_sec: rate,
            pin,
        };
        LoadFlags { options: WorkloadOptions::new(workload, publish), json, latency_plot, pull_beside: false }
    }
}

/// Set by the first Ctrl-C; publishers stop sending and drain what is in flight.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: nix::libc::c_int) {
    // Only an atomic store: nothing else is async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// Ends a run early but orderly on Ctrl-C, so the results so far are printed and the scratch
/// data directory is removed. SA_RESETHAND restores the default action, so a second Ctrl-C
/// kills the process if draining hangs.
fn stop_on_interrupt() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_interrupt), SaFlags::SA_RESETHAND, SigSet::empty());
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    if let Err(error) = unsafe { sigaction(Signal::SIGINT, &action) } {
        errln!("warning: Ctrl-C will not stop the run cleanly: {error}");
    }
}

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let arguments = cli::hoist(&arguments, &GLOBAL_OPTIONS);
    let flags: Flags = match cli::parse(&cli::program_name(), &arguments) {
        Ok(flags) => flags,
        Err(code) => return ExitCode::from(code),
    };
    match run(flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // A closed standard output has nobody to tell (see `out`).
            if !failure.message.is_empty() {
                errln!("{}", failure.message);
            }
            ExitCode::from(failure.exit_code)
        }
    }
}

/// Writes results to standard output. A closed pipe (`| head`) ends the run quietly with 0,
/// through the callers' `?` so that an embedded daemon and its scratch directory are still
/// removed on the way out; `print!` would panic instead.
fn out(text: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    cli::try_print_out(text).map_err(|error| match error.kind() {
        std::io::ErrorKind::BrokenPipe => Failure { message: String::new(), exit_code: cli::EXIT_OK },
        _ => Failure::runtime(format!("writing standard output: {error}")),
    })
}

/// For the commands that start no daemon and read no data directory: a usage error naming
/// `what` the command does instead, if --server, --embedded or --data-dir was `given`.
fn refuse_daemon_flags(given: bool, what: &str) -> Result<(), Failure> {
    if given {
        return Err(Failure::usage(format!(
            "InvalidArgument: {what}: leave out --server, --embedded and --data-dir"
        )));
    }
    Ok(())
}

fn run(flags: Flags) -> Result<(), Failure> {
    if flags.server.is_some() && flags.embedded {
        return Err(Failure::usage(
            "InvalidArgument: --server and --embedded exclude each other: load a running daemon, or start one",
        ));
    }
    let security_options = cli::SecurityOptions {
        token: flags.token.clone(),
        ca: flags.ca.clone(),
        cert: flags.cert.clone(),
        key: flags.key.clone(),
        server_name: flags.server_name.clone(),
    };
    let security_given = [&flags.token, &flags.ca, &flags.cert, &flags.key, &flags.server_name]
        .iter()
        .any(|option| option.is_some());
    if flags.embedded {
        // The embedded daemon listens on loopback without TLS or authentication: the
        // RINGPOST_* variables, meant for a daemon elsewhere, do not apply to it.
        if security_given {
            return Err(Failure::usage(
                "InvalidArgument: --embedded starts a loopback daemon without TLS or authentication: give --token, --ca, --cert, --key and --server-name with --server",
            ));
        }
    } else {
        ringpost_tools::bench::set_security(security_options.security().map_err(Failure::usage)?);
    }
    let daemon_flags_given = flags.server.is_some() || flags.embedded || flags.data_dir.is_some();
    let load = match flags.workload {
        Command::Disk(disk) => {
            if flags.server.is_some() || flags.embedded {
                return Err(Failure::usage(
                    "InvalidArgument: the disk workload measures a directory, not a daemon: leave out --server and --embedded",
                ));
            }
            return run_disk(flags.data_dir.unwrap_or_else(|| PathBuf::from(".")), disk);
        }
        Command::Loopback(loopback) => {
            refuse_daemon_flags(
                daemon_flags_given,
                "the loopback workload measures TCP over 127.0.0.1 alone",
            )?;
            return run_loopback(loopback);
        }
        Command::Curve(curve) => {
            refuse_daemon_flags(daemon_flags_given, "curve reads result files")?;
            return run_curve(curve);
        }
        Command::Compare(compare) => {
            refuse_daemon_flags(daemon_flags_given, "compare reads two result files")?;
            let (first, second) = (compare::Run::load(&compare.first)?, compare::Run::load(&compare.second)?);
            out(format_args!("{}", compare::table(&first, &second)))?;
            return Ok(());
        }
        Command::Publish(f) => {
            let mut load = load_flags!(Workload::Publish, f, f.rate);
            load.options.publish.topic = f.topic;
            load.options.topics = f.topics;
            load.options.sources = f.sources;
            load
        }
        Command::EndToEnd(f) => {
            let mut load = load_flags!(Workload::EndToEnd, f, f.rate);
            load.options.window = f.window;
            load
        }
        Command::Fanout(f) => {
            let mut load = load_flags!(Workload::Fanout, f, f.rate);
            load.options.window = f.window;
            load.options.subscriptions = f.subscriptions;
            load.options.subscriber_threads = f.subscriber_threads;
            load
        }
        Command::Topics(f) => {
            let mut load = load_flags!(Workload::Topics, f, f.rate);
            load.options.window = f.window;
            load.options.topics = f.topics;
            load.options.subscriber_threads = f.subscriber_threads;
            load.options.settle_seconds = f.settle_seconds;
            load
        }
        Command::Backlog(f) => {
            let mut load = load_flags!(Workload::Backlog, f, None);
            load.options.window = f.window;
            load
        }
        Command::Push(f) => {
            let mut load = load_flags!(Workload::Push, f, f.rate);
            load.options.window = f.window;
            load.options.receiver_host = f.receiver_host;
            load.pull_beside = !f.push_only;
            load
        }
    };
    if flags.data_dir.is_some() && !flags.embedded {
        return Err(Failure::usage(
            "InvalidArgument: --data-dir applies to a load workload only with --embedded; a running daemon has its own",
        ));
    }
    let LoadFlags { mut options, json, latency_plot, pull_beside } = load;
    // Refuse a bad command line before starting a daemon for it.
    options.validate()?;
    // Many topics' streams would need multiplexing the gRPC path does not do, and the
    // backlog's figures are the disk's, whichever protocol drains it.
    if flags.grpc && !matches!(options.workload, Workload::Publish | Workload::EndToEnd | Workload::Fanout) {
        return Err(Failure::usage(format!(
            "InvalidArgument: --grpc runs the publish, e2e and fanout workloads, not {}",
            options.workload.name()
        )));
    }
    if flags.rest && (flags.grpc || options.workload != Workload::Publish) {
        return Err(Failure::usage(
            "InvalidArgument: --rest runs the publish workload alone, without --grpc",
        ));
    }
    if flags.rest_server.is_some() && (!flags.rest || flags.embedded) {
        return Err(Failure::usage(
            "InvalidArgument: --rest-server names a running daemon's REST interface: give it with --rest and --server",
        ));
    }
    // The daemon lives until this function returns, and its scratch directory with it.
    if flags.grpc_server.is_some() && (!flags.grpc || flags.embedded) {
        return Err(Failure::usage(
            "InvalidArgument: --grpc-server names a running daemon's gRPC API: give it with --grpc and --server",
        ));
    }
    if flags.scrape_every.is_some_and(|every| every == 0 || !flags.embedded) {
        return Err(Failure::usage(
            "InvalidArgument: --scrape-every takes milliseconds above 0 and applies with --embedded; a running daemon is scraped by its own Prometheus",
        ));
    }
    let scrape_every = flags.scrape_every.map(std::time::Duration::from_millis);
    let embedded = match flags.embedded {
        true => Some(EmbeddedDaemon::start(flags.data_dir.as_deref(), flags.grpc, flags.rest, scrape_every)?),
        false => None,
    };
    if flags.grpc {
        let address = match &embedded {
            Some(daemon) => daemon.grpc_address.clone().expect("an embedded daemon asked for gRPC serves it"),
            None => flags.grpc_server.clone().unwrap_or_else(|| "127.0.0.1:8085".to_owned()),
        };
        errln!("publishing and consuming through the gRPC API at {address}");
        ringpost_tools::bench::set_grpc(address);
    }
    if flags.rest {
        let address = match &embedded {
            Some(daemon) => daemon.rest_address.clone().expect("an embedded daemon asked for REST serves it"),
            None => flags.rest_server.clone().unwrap_or_else(|| "127.0.0.1:8086".to_owned()),
        };
        errln!("publishing through the REST interface at {address}");
        ringpost_tools::bench::set_rest(address);
    }
    options.publish.server = match &embedded {
        Some(daemon) => {
            let kept = if daemon.is_scratch() { "removed at exit" } else { "kept" };
            errln!(
                "embedded daemon at {} (data directory {}, {kept})",
                daemon.address,
                daemon.data_dir.display()
            );
            // A scratch daemon is removed whole: deleting thousands of topics first would only
            // cost time.
            options.cleanup = !daemon.is_scratch();
            daemon.address.clone()
        }
        None => flags
            .server
            .or_else(|| std::env::var("RINGPOST_SERVER").ok())
            .unwrap_or_else(|| publish::SERVER_DEFAULT.to_owned()),
    };
    stop_on_interrupt();
    if options.workload == Workload::Push && pull_beside {
        return run_push_beside_pull(&options, json.as_deref(), latency_plot.as_deref());
    }
    let report = run_workload(&options)?;
    if let Some(path) = json {
        write_file(&path, &format!("{}\n", report.json(&options)))?;
    }
    finish(&report, &options, latency_plot.as_deref())
}

/// Runs a load workload and prints its table.
fn run_workload(options: &WorkloadOptions) -> Result<Report, Failure> {
    let report = workload::run(options, &STOP, &mut |progress| errln!("{}", progress.line()), &mut |line| {
        errln!("{line}")
    })?;
    for warning in &report.warnings {
        errln!("warning: {warning}");
    }
    out(format_args!("{}", report.table(options)))?;
    Ok(report)
}

/// The push workload after W2's streaming pull of as many messages, published the same way,
/// on the same daemon: each half has the machine to itself, and the ratio of their deliveries
/// per second is the figure to read. The JSON is the push's, with W2's under `pull`.
fn run_push_beside_pull(
    options: &WorkloadOptions,
    json_path: Option<&Path>,
    plot_path: Option<&Path>,
) -> Result<(), Failure> {
    let pull_options = WorkloadOptions { workload: Workload::EndToEnd, ..options.clone() };
    errln!("W2: the messages through a streaming pull");
    let pull = run_workload(&pull_options)?;
    if let Err(failure) = finish_checks(&pull, &pull_options) {
        return Err(Failure::runtime(format!("W2's streaming pull: {}", failure.message)));
    }
    errln!("push: as many messages pushed to the receiver");
    let push = run_workload(options)?;
    let rate = |report: &Report| report.delivery.as_ref().map_or(0.0, |d| d.deliveries_per_sec());
    let ratio = if rate(&pull) > 0.0 { rate(&push) / rate(&pull) } else { 0.0 };
    out(format_args!(
        "push {} deliveries/s, W2's streaming pull {} deliveries/s in the same run: push/pull {ratio:.2}\n",
        thousands(rate(&push).round() as u64),
        thousands(rate(&pull).round() as u64),
    ))?;
    if let Some(path) = json_path {
        let mut json = push.json(options);
        // Report::json is one object: W2's goes inside it, before its closing brace.
        json.pop();
        let ratio = json_number(ratio, 3);
        json.push_str(&format!(",\"push_to_pull\":{ratio},\"pull\":{}}}", pull.json(&pull_options)));
        write_file(path, &format!("{json}\n"))?;
    }
    finish(&push, options, plot_path)
}

/// Writes the plot, then fails the run if it was interrupted or had problems.
fn finish(report: &Report, options: &WorkloadOptions, plot_path: Option<&Path>) -> Result<(), Failure> {
    if let Some(path) = plot_path {
        write_file(path, &report.latency_svg(options))?;
    }
    finish_checks(report, options)
}

/// The run's failure, if it was interrupted or had problems.
fn finish_checks(report: &Report, options: &WorkloadOptions) -> Result<(), Failure> {
    if STOP.load(Ordering::Relaxed) {
        return Err(Failure::runtime(format!(
            "interrupted: {} of {} messages were sent",
            thousands(report.messages()),
            thousands(options.publish.messages)
        )));
    }
    let problems = report.problems();
    if !problems.is_empty() {
        return Err(Failure::runtime(problems.join("; ")));
    }
    Ok(())
}

fn run_disk(data_dir: PathBuf, flags: DiskFlags) -> Result<(), Failure> {
    let defaults = DiskOptions::default();
    let options = DiskOptions {
        data_dir,
        block_sizes: flags.block_sizes.unwrap_or(defaults.block_sizes.clone()),
        bytes_per_size: flags.bytes_per_size.unwrap_or(defaults.bytes_per_size),
        fresh: flags.fresh,
        in_flight: flags.in_flight,
        ..defaults
    };
    let failure =
        |error: std::io::Error, data_dir: &std::path::Path| match (error.kind(), error.raw_os_error()) {
            // The disk module refuses impossible options with InvalidInput and no OS error; an
            // EINVAL from the kernel (O_DIRECT on tmpfs, say) is a run-time failure instead.
            (std::io::ErrorKind::InvalidInput, None) => Failure::usage(format!("InvalidArgument: {error}")),
            _ => Failure::runtime(format!("measuring {}: {error}", data_dir.display())),
        };
    if flags.read {
        if flags.fresh {
            return Err(Failure::usage(
                "InvalidArgument: --read and --fresh measure different things; give one",
            ));
        }
        let results = disk::measure_reads(&options, &mut |line| errln!("{line}"))
            .map_err(|error| failure(error, &options.data_dir))?;
        for result in &results {
            out(format_args!(
                "{}\n",
                format_args!(
                    "{:>8} KiB reads: {:>9.1} MB/s, {} reads in {:.2} s, read p50 {} us, p99 {} us{}",
                    result.block_bytes / 1024,
                    result.mb_per_sec,
                    thousands(result.reads),
                    result.seconds,
                    result.read_p50_us,
                    result.read_p99_us,
                    if result.o_direct { "" } else { " (no O_DIRECT: page cache)" }
                )
            ))?;
        }
        out(format_args!(
            "{}\n",
            format_args!(
                "measured in {}: sequential O_DIRECT reads of written blocks, {} at a time",
                options.data_dir.display(),
                options.in_flight
            )
        ))?;
        if let Some(path) = &flags.json {
            write_file(path, &format!("{}\n", disk::reads_to_json(&results)))?;
        }
        return Ok(());
    }
    // Fresh space is written once, so the file is as large as the budget (and holds one write
    // of the largest size at least).
    let options = match options.fresh {
        true => {
            let largest = options.block_sizes.iter().copied().max().unwrap_or(0) as u64;
            DiskOptions {
                file_bytes: options.bytes_per_size.max(largest).next_multiple_of(1 << 20),
                ..options
            }
        }
        false => options,
    };
    let results = disk::measure(&options, &mut |line| errln!("{line}"))
        .map_err(|error| failure(error, &options.data_dir))?;
    out(format_args!("{}", disk_table(&results)))?;
    let space = match options.fresh {
        true => "into fallocated space, each block once",
        false => "over written blocks",
    };
    out(format_args!(
        "{}\n",
        format_args!(
            "measured in {}: O_DIRECT writes {space}, each followed by fdatasync, {} at a time",
            options.data_dir.display(),
            options.in_flight
        )
    ))?;
    if let Some(path) = &flags.json {
        write_file(path, &format!("{}\n", disk::to_json(&results)))?;
    }
    Ok(())
}

fn run_curve(flags: CurveFlags) -> Result<(), Failure> {
    if flags.y.is_empty() || flags.files.is_empty() {
        return Err(Failure::usage("InvalidArgument: give at least one --y field and one result file"));
    }
    let mut ceilings = Vec::new();
    for text in &flags.ceiling {
        let parsed =
            text.rsplit_once('=').and_then(|(name, value)| Some((name, value.trim().parse::<f64>().ok()?)));
        let Some((name, y)) = parsed else {
            return Err(Failure::usage(format!("InvalidArgument: --ceiling '{text}' is not NAME=NUMBER")));
        };
        ceilings.push(curve::Ceiling { name: name.to_owned(), y });
    }
    let runs = flags.files.iter().map(|path| compare::Run::load(path)).collect::<Result<Vec<_>, _>>()?;
    let fields: Vec<(&str, &str)> =
        flags.y.iter().map(|y| y.split_once('=').unwrap_or((y.as_str(), y.as_str()))).collect();
    let (lines, notes) = curve::lines_from_runs(&runs, &flags.x, &fields);
    for note in notes {
        errln!("note: {note}");
    }
    let chart = curve::Chart {
        title: flags.title,
        x_label: flags.x_label.unwrap_or_else(|| flags.x.clone()),
        y_label: flags.y_label,
        x_log: flags.x_log,
        y_log: flags.y_log,
        lines,
        ceilings,
    };
    out(format_args!("{}", curve::markdown_table(&chart)))?;
    if let Some(path) = &flags.svg {
        write_file(path, &curve::svg(&chart))?;
    }
    Ok(())
}

fn run_loopback(flags: LoopbackFlags) -> Result<(), Failure> {
    if let Some(requests) = flags.requests {
        return run_request_loopback(&flags, requests);
    }
    let defaults = LoopbackOptions::default();
    let mut results = Vec::new();
    for connections in flags.connections.unwrap_or_else(|| vec![1, 4]) {
        let options = LoopbackOptions {
            connections,
            bytes_per_connection: flags.bytes.unwrap_or(defaults.bytes_per_connection),
        };
        let result = loopback::measure(&options).map_err(|error| match error.kind() {
            std::io::ErrorKind::InvalidInput => Failure::usage(format!("InvalidArgument: {error}")),
            _ => Failure::runtime(format!("measuring loopback TCP: {error}")),
        })?;
        out(format_args!(
            "{}\n",
            format_args!(
                "{} connection(s): {:.1} MB/s ({} bytes in {:.2} s, {} KiB writes)",
                result.connections,
                result.mb_per_sec,
                thousands(result.bytes),
                result.seconds,
                loopback::CHUNK_BYTES / 1024
            )
        ))?;
        results.push(result);
    }
    if let Some(path) = &flags.json {
        let rows: Vec<String> = results
            .iter()
            .map(|result| {
                ringpost_tools::json::object(&[
                    ("connections", result.connections.to_string()),
                    ("bytes", result.bytes.to_string()),
                    ("seconds", json_number(result.seconds, 3)),
                    ("mb_per_sec", json_number(result.mb_per_sec, 1)),
                ])
            })
            .collect();
        write_file(path, &format!("{{\"workload\":\"loopback\",\"results\":[{}]}}\n", rows.join(",")))?;
    }
    Ok(())
}

/// `loopback --requests`: the request ceiling for each connection count.
fn run_request_loopback(flags: &LoopbackFlags, requests: u64) -> Result<(), Failure> {
    let mut rows = Vec::new();
    for connections in flags.connections.clone().unwrap_or_else(|| vec![1, 4]) {
        let options = loopback::RequestLoopbackOptions {
            requests_per_connection: requests,
            connections,
            request_bytes: flags.request_bytes,
            response_bytes: flags.response_bytes,
            in_flight: flags.in_flight,
        };
        let result = loopback::measure_requests(&options).map_err(|error| match error.kind() {
            std::io::ErrorKind::InvalidInput => Failure::usage(format!("InvalidArgument: {error}")),
            _ => Failure::runtime(format!("measuring loopback requests: {error}")),
        })?;
        out(format_args!(
            "{} connection(s), {} in flight each: {} requests/s ({} requests of {} B answered with {} B in {:.2} s)\n",
            result.connections,
            options.in_flight,
            thousands(result.requests_per_sec as u64),
            thousands(result.requests),
            options.request_bytes,
            options.response_bytes,
            result.seconds
        ))?;
        rows.push(ringpost_tools::json::object(&[
            ("connections", result.connections.to_string()),
            ("in_flight", options.in_flight.to_string()),
            ("request_bytes", options.request_bytes.to_string()),
            ("response_bytes", options.response_bytes.to_string()),
            ("requests", result.requests.to_string()),
            ("seconds", json_number(result.seconds, 3)),
            ("requests_per_sec", json_number(result.requests_per_sec, 0)),
        ]));
    }
    if let Some(path) = &flags.json {
        write_file(
            path,
            &format!("{{\"workload\":\"loopback_requests\",\"results\":[{}]}}\n", rows.join(",")),
        )?;
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

fn write_file(path: &Path, contents: &str) -> Result<(), Failure> {
    std::fs::write(path, contents)
        .map_err(|error| Failure::runtime(format!("writing {}: {error}", path.display())))
}
