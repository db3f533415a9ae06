//! What pulls and streams may hold: a response reads only what it can carry, and the streams
//! of a shard share one budget (`STREAM_RESERVED_BYTES_SHARD_MAX`, 128 MiB) for the frames they
//! read and queue, so subscribers that stall cannot take the daemon's memory.

use ringpost_client::{block_on, Message, StreamSettings};
use ringpost_tests::{create_subscription, create_topic_and_subscription, Daemon};
use std::time::{Duration, Instant};

const MESSAGE_BYTES: usize = 1_000_000;
const MESSAGES: usize = 100;
const STREAMS: usize = 30;
/// What the daemon's resident memory may grow by while the stalled streams wait: six times the
/// streams' budget of 128 MiB. Measured +184 to +475 MiB, the most with the whole suite running
/// beside it: beyond the frames the budget counts, the read buffers and extents behind them
/// and the allocator's slack, not yet accounted for one by one. Without the budget each
/// stream read every leased message and queued four 12 MiB frames: +2.4 GB, and growing.
const GROWTH_KIB_MAX: u64 = 6 * 128 * 1024;

#[test]
fn thirty_stalled_streams_of_large_messages_hold_a_bounded_amount_of_memory() {
    let daemon = Daemon::start_with("pull-memory", Vec::new(), vec!["--shards".into(), "1".into()]);
    let client = daemon.client();
    create_topic_and_subscription(&client, "large", "large-0", 600);
    for index in 1..STREAMS {
        create_subscription(&client, &format!("large-{index}"), "large", 600);
    }
    create_topic_and_subscription(&client, "small", "small-sub", 10);
    let payload = vec![7u8; MESSAGE_BYTES];
    for _ in 0..MESSAGES {
        block_on(client.publish("large", vec![Message::new(payload.clone())])).unwrap();
    }
    // A unary pull of twelve of them reads and sends at most one response's worth.
    let pulled = block_on(client.pull("large-0", 1000, 0)).unwrap();
    assert!((1..=12).contains(&pulled.len()), "{} messages of 1 MB in one response", pulled.len());
    let before_kib = daemon.memory_kib("VmRSS:");

    // Streams whose subscribers never read: the window (1,000 messages, 1 GB) would take all.
    let settings = StreamSettings {
        max_outstanding_messages: 1000,
        max_outstanding_bytes: 1 << 30,
        ..StreamSettings::default()
    };
    let streams: Vec<_> = (0..STREAMS)
        .map(|index| block_on(client.streaming_pull(&format!("large-{index}"), settings.clone())).unwrap())
        .collect();
    let started = Instant::now();
    let mut peak_kib = 0;
    while started.elapsed() < Duration::from_secs(6) {
        peak_kib = peak_kib.max(daemon.memory_kib("VmRSS:"));
        std::thread::sleep(Duration::from_millis(100));
    }
    // The shard still serves everyone else.
    block_on(client.publish("small", vec![Message::new("beside the stalled streams")])).unwrap();
    let growth_kib = peak_kib.saturating_sub(before_kib);
    eprintln!(
        "resident before the streams {} MiB, peak with {STREAMS} stalled streams {} MiB (+{} MiB)",
        before_kib / 1024,
        peak_kib / 1024,
        growth_kib / 1024
    );
    assert!(growth_kib < GROWTH_KIB_MAX, "resident memory grew by {} MiB", growth_kib / 1024);
    drop(streams);
}

/// Two hundred unary pulls of 1 MB messages sent on one connection that never reads its
/// answers: each response's bytes come out of the same budget as the streams', so the daemon
/// holds a bounded amount however many pulls wait for their sockets.
#[test]
fn many_unread_unary_pulls_of_large_messages_hold_a_bounded_amount_of_memory() {
    use ringpost_wire::messages::PullRequest;
    use std::io::Write;
    const PULLS: u64 = 200;
    let daemon = Daemon::start_with("pull-memory-unary", Vec::new(), vec!["--shards".into(), "1".into()]);
    let client = daemon.client();
    // Twenty subscriptions of 100 MB each: 2 GB of responses for the pulls to hold.
    const SUBSCRIPTIONS: u64 = 20;
    create_topic_and_subscription(&client, "large", "large-0", 600);
    for index in 1..SUBSCRIPTIONS {
        create_subscription(&client, &format!("large-{index}"), "large", 600);
    }
    create_topic_and_subscription(&client, "small", "small-sub", 10);
    let payload = vec![7u8; MESSAGE_BYTES];
    for _ in 0..MESSAGES {
        block_on(client.publish("large", vec![Message::new(payload.clone())])).unwrap();
    }
    let forwarder = block_on(client.lookup_topic("large")).unwrap().remove(0);
    let before_kib = daemon.memory_kib("VmRSS:");
    let mut socket = std::net::TcpStream::connect(&forwarder).unwrap();
    for request_id in 1..=PULLS {
        let subscription = format!("large-{}", request_id % SUBSCRIPTIONS);
        let request = PullRequest { subscription, max_messages: 1000, wait_ms: 1000 };
        let frame = ringpost_wire::encode_frame(ringpost_wire::Command::Pull.code(), 0, request_id, &request);
        socket.write_all(&frame).unwrap();
    }
    let started = Instant::now();
    let mut peak_kib = 0;
    while started.elapsed() < Duration::from_secs(5) {
        peak_kib = peak_kib.max(daemon.memory_kib("VmRSS:"));
        std::thread::sleep(Duration::from_millis(100));
    }
    block_on(client.publish("small", vec![Message::new("beside the unread pulls")])).unwrap();
    // The pulls were served: the first answer is a batch of the large messages.
    let mut header = [0u8; ringpost_wire::limits::FRAME_HEADER_BYTES];
    std::io::Read::read_exact(&mut socket, &mut header).unwrap();
    let header = ringpost_wire::frame::FrameHeader::decode(&header).unwrap();
    assert!(!header.is_error() && header.body_length as usize > 10 * MESSAGE_BYTES, "{header:?}");
    let growth_kib = peak_kib.saturating_sub(before_kib);
    eprintln!(
        "resident before the pulls {} MiB, peak with {PULLS} unread pulls {} MiB (+{} MiB)",
        before_kib / 1024,
        peak_kib / 1024,
        growth_kib / 1024
    );
    // Within the budget itself: the responses that fit it are read into buffers the shard
    // holds anyway (its cache, its I/O memory), and the rest wait (+0 MiB measured; +271 MiB
    // before pulls took their share of the budget).
    assert!(growth_kib < 128 * 1024, "resident memory grew by {} MiB", growth_kib / 1024);
    drop(socket);
}
