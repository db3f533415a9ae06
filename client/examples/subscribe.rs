//! Receives messages with the [`Subscriber`]: a handler, run on the subscriber's worker threads,
//! prints and acks each one. Stops after COUNT messages or TIMEOUT seconds, then shuts down
//! gracefully (the acks are sent before the stream closes). Ctrl-C ends the process at once:
//! acks not sent yet are lost, and those messages are delivered again (at-least-once).
//!
//! ```text
//! cargo run -p ringpost-client --example subscribe -- [ADDRESS] [COUNT] [SUBSCRIPTION] [TOPIC] [TIMEOUT]
//! ```
//!
//! ADDRESS is the router's host:port (default: `$RINGPOST_SERVER`, else 127.0.0.1:7450);
//! COUNT defaults to 10 (0: until the timeout), SUBSCRIPTION to `examples-sub`, TOPIC to
//! `examples` and TIMEOUT to 60 s. The topic and the subscription are created if missing.

use ringpost_client::{
    block_on, Client, ErrorCode, ShutdownMode, Subscriber, SubscriberSettings, Subscription,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (address, args) = server_and_args();
    let count: usize = args.first().map(|count| count.parse()).transpose()?.unwrap_or(10);
    let subscription = args.get(1).cloned().unwrap_or_else(|| "examples-sub".into());
    let topic = args.get(2).cloned().unwrap_or_else(|| "examples".into());
    let timeout = Duration::from_secs(args.get(3).map(|seconds| seconds.parse()).transpose()?.unwrap_or(60));

    let client = Arc::new(block_on(Client::connect(&address))?);
    match block_on(client.create_topic(&topic)) {
        Ok(_) => println!("created topic {topic}"),
        Err(error) if error.code() == ErrorCode::AlreadyExists => {}
        Err(error) => return Err(error.into()),
    }
    let wanted = Subscription { name: subscription.clone(), topic: topic.clone(), ..Default::default() };
    match block_on(client.create_subscription(wanted)) {
        Ok(_) => println!("created subscription {subscription} on {topic}"),
        Err(error) if error.code() == ErrorCode::AlreadyExists => {}
        Err(error) => return Err(error.into()),
    }

    let subscriber = Subscriber::new(client, &subscription, SubscriberSettings::default())?;
    let received = Arc::new(AtomicUsize::new(0));
    let counted = received.clone();
    subscriber.run(move |message, handle| {
        println!(
            "received id {} attempt {}: {}",
            message.message_id,
            message.delivery_attempt,
            String::from_utf8_lossy(&message.data)
        );
        handle.ack();
        counted.fetch_add(1, Ordering::Relaxed);
    })?;
    println!("listening on {subscription} at {address}");

    let started = Instant::now();
    while (count == 0 || received.load(Ordering::Relaxed) < count) && started.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(20));
    }
    if count != 0 && received.load(Ordering::Relaxed) < count {
        println!("timed out after {timeout:?}");
    }
    // Lets running handlers finish and sends their acks before closing the stream.
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing))?;
    let stats = subscriber.stats();
    println!("received {} messages, acked {}", received.load(Ordering::Relaxed), stats.acked);
    Ok(())
}

/// The router address (first argument if it looks like host:port, else `$RINGPOST_SERVER`,
/// else 127.0.0.1:7450) and the remaining arguments.
fn server_and_args() -> (String, Vec<String>) {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|first| first.contains(':')) {
        let address = args.remove(0);
        return (address, args);
    }
    let address = std::env::var("RINGPOST_SERVER").unwrap_or_else(|_| "127.0.0.1:7450".into());
    (address, args)
}
