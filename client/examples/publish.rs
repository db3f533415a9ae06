//! Publishes N messages with the batching [`Publisher`] and prints each message's id.
//!
//! ```text
//! cargo run -p ringpost-client --example publish -- [ADDRESS] [COUNT] [TOPIC]
//! ```
//!
//! ADDRESS is the router's host:port (default: `$RINGPOST_SERVER`, else 127.0.0.1:7450);
//! COUNT defaults to 10 and TOPIC to `examples`, which is created if missing. Run the
//! `subscribe` example first so that its subscription exists and receives the messages: a
//! subscription gets the messages published after it was created.

use ringpost_client::{block_on, Client, ErrorCode, Message, Publisher, PublisherSettings};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (address, args) = server_and_args();
    let count: usize = args.first().map(|count| count.parse()).transpose()?.unwrap_or(10);
    let topic = args.get(1).cloned().unwrap_or_else(|| "examples".into());

    let client = Arc::new(block_on(Client::connect(&address))?);
    match block_on(client.create_topic(&topic)) {
        Ok(_) => println!("created topic {topic}"),
        Err(error) if error.code() == ErrorCode::AlreadyExists => {}
        Err(error) => return Err(error.into()),
    }

    let publisher = Publisher::new(client, &topic, PublisherSettings::default())?;
    // `publish` queues at once; the publisher sends batches of up to 100 messages, 1 MB or
    // 10 ms, and each future resolves with its message's id once the batch is durable.
    let pending: Vec<_> = (0..count)
        .map(|index| {
            let message = Message::new(format!("message {index}")).attribute("index", index.to_string());
            publisher.publish(message)
        })
        .collect();
    for (index, future) in pending.into_iter().enumerate() {
        let id = block_on(future)?;
        println!("published message {index} as id {id}");
    }
    block_on(publisher.shutdown());
    println!("published {count} messages to {topic} at {address}");
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
