//! Ordering keys end to end: publishes PER_KEY messages for each of KEYS ordering keys,
//! interleaved, then receives them from a subscription with message ordering and shows that
//! each key's messages arrived in publish order (different keys interleave freely).
//!
//! ```text
//! cargo run -p ringpost-client --example ordering -- [ADDRESS] [KEYS] [PER_KEY]
//! ```
//!
//! ADDRESS is the router's host:port (default: `$RINGPOST_SERVER`, else 127.0.0.1:7450);
//! KEYS defaults to 3 and PER_KEY to 5. The topic `ordering-example` and the ordered
//! subscription `ordering-example-sub` are created if missing. Exits with status 1 if a key's
//! messages arrived out of order.

use ringpost_client::{
    block_on, Client, ErrorCode, Message, Publisher, PublisherSettings, ShutdownMode, Subscriber,
    SubscriberSettings, Subscription,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TOPIC: &str = "ordering-example";
const SUBSCRIPTION: &str = "ordering-example-sub";
const TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (address, args) = server_and_args();
    let keys: usize = args.first().map(|keys| keys.parse()).transpose()?.unwrap_or(3);
    let per_key: usize = args.get(1).map(|count| count.parse()).transpose()?.unwrap_or(5);

    let client = Arc::new(block_on(Client::connect(&address))?);
    match block_on(client.create_topic(TOPIC)) {
        Ok(_) => println!("created topic {TOPIC}"),
        Err(error) if error.code() == ErrorCode::AlreadyExists => {}
        Err(error) => return Err(error.into()),
    }
    let wanted = Subscription {
        name: SUBSCRIPTION.into(),
        topic: TOPIC.into(),
        enable_message_ordering: true,
        ..Default::default()
    };
    match block_on(client.create_subscription(wanted)) {
        Ok(_) => println!("created subscription {SUBSCRIPTION} with message ordering"),
        Err(error) if error.code() == ErrorCode::AlreadyExists => {}
        Err(error) => return Err(error.into()),
    }

    // Messages of earlier runs still in the subscription are acked and not counted.
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos().to_string();
    let publisher = Publisher::new(client.clone(), TOPIC, PublisherSettings::default())?;
    let mut pending = Vec::new();
    for sequence in 0..per_key {
        for key in 0..keys {
            let message = Message::new(format!("key-{key} #{sequence}"))
                .ordering_key(format!("key-{key}"))
                .attribute("sequence", sequence.to_string())
                .attribute("run", run.clone());
            pending.push((key, sequence, publisher.publish(message)));
        }
    }
    for (key, sequence, future) in pending {
        println!("published key-{key} #{sequence} as id {}", block_on(future)?);
    }
    block_on(publisher.shutdown());

    let seen: Arc<Mutex<BTreeMap<String, Vec<usize>>>> = Arc::default();
    let recorded = seen.clone();
    let subscriber = Subscriber::new(client, SUBSCRIPTION, SubscriberSettings::default())?;
    subscriber.run(move |message, handle| {
        let attribute = |name: &str| {
            message
                .attributes
                .iter()
                .find(|attribute| attribute.key == name)
                .map(|attribute| attribute.value.clone())
        };
        if attribute("run").as_deref() == Some(run.as_str()) {
            let sequence =
                attribute("sequence").and_then(|sequence| sequence.parse().ok()).unwrap_or(usize::MAX);
            recorded.lock().unwrap().entry(message.ordering_key.clone()).or_default().push(sequence);
        }
        handle.ack();
    })?;
    let started = Instant::now();
    let total = |seen: &BTreeMap<String, Vec<usize>>| seen.values().map(Vec::len).sum::<usize>();
    while total(&seen.lock().unwrap()) < keys * per_key && started.elapsed() < TIMEOUT {
        std::thread::sleep(Duration::from_millis(20));
    }
    block_on(subscriber.shutdown(ShutdownMode::WaitForProcessing))?;

    let seen = seen.lock().unwrap();
    let mut in_order = true;
    for (key, sequences) in seen.iter() {
        // A redelivery repeats earlier messages; what matters is that no message arrives
        // before one published earlier with the same key.
        let mut expected = 0;
        let mut ordered = true;
        for &sequence in sequences {
            if sequence == expected {
                expected += 1;
            } else if sequence > expected {
                ordered = false;
            }
        }
        let list: Vec<String> = sequences.iter().map(usize::to_string).collect();
        let verdict = if ordered { "in order" } else { "OUT OF ORDER" };
        println!("{key}: {} ({verdict})", list.join(" "));
        in_order &= ordered && expected == per_key;
    }
    println!("received {} of {} messages", total(&seen), keys * per_key);
    if !in_order || seen.len() != keys {
        println!("FAILED: not every key arrived complete and in order");
        std::process::exit(1);
    }
    println!("every key arrived in publish order");
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
