//! `ringpost`: the admin and messaging CLI.

use argh::FromArgs;
use ringpost_client::{block_on, Client, Error, Message, Subscription, Topic};
use ringpost_tools::bench::report::summary_json;
use ringpost_tools::json;
use std::io::BufRead;
use std::process::ExitCode;

/// Ringpost's command line: topics, subscriptions, publish, pull, acknowledge.
#[derive(FromArgs)]
struct Flags {
    /// the router's address (default 127.0.0.1:7450, or $RINGPOST_SERVER)
    #[argh(option)]
    server: Option<String>,
    /// output format of get and list: json (default, one object per line) or table
    #[argh(option, default = "Output::Json")]
    output: Output,
    #[argh(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq)]
enum Output {
    Json,
    Table,
}

impl std::str::FromStr for Output {
    type Err = String;
    fn from_str(text: &str) -> Result<Output, String> {
        match text {
            "json" => Ok(Output::Json),
            "table" => Ok(Output::Table),
            other => Err(format!("unknown output '{other}': use json or table")),
        }
    }
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum Command {
    Topic(TopicCommand),
    Sub(SubCommand),
    Publish(PublishCommand),
    Pull(PullCommand),
    Ack(AckCommand),
    Nack(NackCommand),
    Modack(ModackCommand),
    Stats(StatsCommand),
    Admin(AdminCommand),
    Snapshot(SnapshotCommand),
}

/// show topics, subscriptions (backlog, outstanding, oldest unacked age, deliveries) and the
/// health of every shard's data directories
#[derive(FromArgs)]
#[argh(subcommand, name = "stats")]
struct StatsCommand {}

/// operator actions
#[derive(FromArgs)]
#[argh(subcommand, name = "admin")]
struct AdminCommand {
    #[argh(subcommand)]
    action: AdminAction,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum AdminAction {
    ResyncDir(ResyncDir),
}

/// bring a fenced data directory back: rewrite every log's copy in it from healthy copies,
/// then let it take writes again
#[derive(FromArgs)]
#[argh(subcommand, name = "resync-dir")]
struct ResyncDir {
    /// the directory's index, from 0, in the order of ringpostd's --data-dir flags
    #[argh(positional)]
    index: u32,
}

/// manage topics
#[derive(FromArgs)]
#[argh(subcommand, name = "topic")]
struct TopicCommand {
    #[argh(subcommand)]
    action: TopicAction,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum TopicAction {
    Create(TopicCreate),
    Get(TopicGet),
    List(TopicList),
    Delete(TopicDelete),
}

/// create a topic
#[derive(FromArgs)]
#[argh(subcommand, name = "create")]
struct TopicCreate {
    /// topic name: 3 to 255 characters, starting with a letter
    #[argh(positional)]
    name: String,
    /// keep messages this many seconds even once acknowledged (600 to 2678400; default: until
    /// every subscription acknowledged them)
    #[argh(option)]
    retention: Option<u64>,
}

/// show a topic
#[derive(FromArgs)]
#[argh(subcommand, name = "get")]
struct TopicGet {
    #[argh(positional)]
    name: String,
}

/// list topics
#[derive(FromArgs)]
#[argh(subcommand, name = "list")]
struct TopicList {}

/// delete a topic and its messages; its subscriptions stay, detached
#[derive(FromArgs)]
#[argh(subcommand, name = "delete")]
struct TopicDelete {
    #[argh(positional)]
    name: String,
}

/// manage subscriptions
#[derive(FromArgs)]
#[argh(subcommand, name = "sub")]
struct SubCommand {
    #[argh(subcommand)]
    action: SubAction,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum SubAction {
    Create(SubCreate),
    Get(SubGet),
    List(SubList),
    Delete(SubDelete),
    Seek(SubSeek),
}

/// create a subscription: it receives every message published to the topic from now on
#[derive(FromArgs)]
#[argh(subcommand, name = "create")]
struct SubCreate {
    /// subscription name
    #[argh(positional)]
    name: String,
    /// the topic to subscribe to
    #[argh(option)]
    topic: String,
    /// seconds a delivered message is leased before it is delivered again (10 to 600; default 10)
    #[argh(option, default = "0")]
    ack_deadline: u32,
    /// keep acknowledged messages for the retention period
    #[argh(switch)]
    retain_acked: bool,
    /// seconds unacknowledged messages are kept (600 to 2678400; default 7 days)
    #[argh(option, default = "0")]
    retention: u64,
    /// seconds of inactivity after which the subscription expires (at least 86400; default 31 days)
    #[argh(option, default = "0")]
    expiration: u64,
    /// deliver messages with the same ordering key in publish order
    #[argh(switch)]
    ordering: bool,
    /// only deliver messages matching this attribute filter, e.g. 'attributes.region = "eu"'
    /// (the others are acknowledged automatically; at most 256 bytes; cannot be changed later)
    #[argh(option, default = "String::new()")]
    filter: String,
    /// topic that receives messages which failed --max-delivery-attempts times
    #[argh(option, default = "String::new()")]
    dead_letter_topic: String,
    /// deliveries before a message goes to the dead-letter topic (5 to 100; default 5)
    #[argh(option, default = "0")]
    max_delivery_attempts: u32,
    /// seconds to wait before redelivering a nacked or expired message, doubling per attempt
    /// (0 to 600; setting either backoff sets a retry policy, default 10)
    #[argh(option, default = "0")]
    min_backoff: u32,
    /// longest retry backoff in seconds (0 to 600; default 600 once a retry policy is set)
    #[argh(option, default = "0")]
    max_backoff: u32,
}

/// move a subscription's acknowledgements to a time: earlier messages count as acknowledged,
/// later ones (even acknowledged ones still retained) are delivered again
#[derive(FromArgs)]
#[argh(subcommand, name = "seek")]
struct SubSeek {
    /// the subscription
    #[argh(positional)]
    name: String,
    /// an RFC 3339 time (2026-11-30T10:00:00Z) or milliseconds since the Unix epoch
    #[argh(option)]
    time: Option<String>,
    /// a snapshot of the same topic to seek to instead of a time
    #[argh(option)]
    snapshot: Option<String>,
}

/// manage snapshots: a subscription's acknowledgements, kept to seek back to (7 days)
#[derive(FromArgs)]
#[argh(subcommand, name = "snapshot")]
struct SnapshotCommand {
    #[argh(subcommand)]
    action: SnapshotAction,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum SnapshotAction {
    Create(SnapshotCreate),
    List(SnapshotList),
    Delete(SnapshotDelete),
}

/// capture a subscription's acknowledgements
#[derive(FromArgs)]
#[argh(subcommand, name = "create")]
struct SnapshotCreate {
    #[argh(positional)]
    name: String,
    /// the subscription to capture
    #[argh(option)]
    subscription: String,
}

/// list snapshots
#[derive(FromArgs)]
#[argh(subcommand, name = "list")]
struct SnapshotList {}

/// delete a snapshot
#[derive(FromArgs)]
#[argh(subcommand, name = "delete")]
struct SnapshotDelete {
    #[argh(positional)]
    name: String,
}

/// show a subscription
#[derive(FromArgs)]
#[argh(subcommand, name = "get")]
struct SubGet {
    #[argh(positional)]
    name: String,
}

/// list subscriptions
#[derive(FromArgs)]
#[argh(subcommand, name = "list")]
struct SubList {
    /// only those of this topic
    #[argh(option)]
    topic: Option<String>,
}

/// delete a subscription
#[derive(FromArgs)]
#[argh(subcommand, name = "delete")]
struct SubDelete {
    #[argh(positional)]
    name: String,
}

/// publish messages (arguments, or one per line of standard input) and print their ids
#[derive(FromArgs)]
#[argh(subcommand, name = "publish")]
struct PublishCommand {
    /// the topic
    #[argh(positional)]
    topic: String,
    /// an attribute key=value, repeatable
    #[argh(option)]
    attr: Vec<String>,
    /// ordering key of every message: an ordered subscription delivers them in this order
    #[argh(option, default = "String::new()")]
    ordering_key: String,
    /// the messages; none reads standard input, one message per line
    #[argh(positional)]
    messages: Vec<String>,
}

/// pull messages and print one JSON object per line
#[derive(FromArgs)]
#[argh(subcommand, name = "pull")]
struct PullCommand {
    /// the subscription
    #[argh(positional)]
    subscription: String,
    /// most messages to return (1 to 1000; default 1)
    #[argh(option, default = "1")]
    max: u32,
    /// seconds to wait for a first message (default 0: return at once)
    #[argh(option, default = "0.0")]
    wait: f64,
    /// acknowledge the messages once printed
    #[argh(switch)]
    ack: bool,
    /// print data as base64 (for binary payloads) instead of UTF-8 text
    #[argh(switch)]
    base64: bool,
    /// follow the subscription with a streaming pull until interrupted (--max is then the
    /// stream's window of unacknowledged messages)
    #[argh(switch)]
    stream: bool,
}

/// acknowledge messages
#[derive(FromArgs)]
#[argh(subcommand, name = "ack")]
struct AckCommand {
    #[argh(positional)]
    subscription: String,
    #[argh(positional)]
    ack_ids: Vec<String>,
}

/// ask for messages to be delivered again now
#[derive(FromArgs)]
#[argh(subcommand, name = "nack")]
struct NackCommand {
    #[argh(positional)]
    subscription: String,
    #[argh(positional)]
    ack_ids: Vec<String>,
}

/// change the ack deadline of leased messages (0 to 600 seconds; 0 is a nack)
#[derive(FromArgs)]
#[argh(subcommand, name = "modack")]
struct ModackCommand {
    #[argh(positional)]
    subscription: String,
    #[argh(positional)]
    seconds: u32,
    #[argh(positional)]
    ack_ids: Vec<String>,
}

/// A failure and the exit code it maps to.
struct Failure(String, u8);

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        let code = match &error {
            Error::Status(_) => 1,
            _ => 3,
        };
        let text = match error {
            Error::Status(status) => status.to_string(),
            Error::Connect { address, source } => {
                format!("Unavailable: cannot connect to {address}: {source}")
            }
            other => format!("{}: {other}", other.code()),
        };
        Failure(text, code)
    }
}

fn main() -> ExitCode {
    let flags: Flags = argh::from_env();
    let server = flags
        .server
        .clone()
        .or_else(|| std::env::var("RINGPOST_SERVER").ok())
        .unwrap_or_else(|| "127.0.0.1:7450".to_owned());
    match block_on(run(&server, flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(text, code)) => {
            eprintln!("{text}");
            ExitCode::from(code)
        }
    }
}

fn print_stats(output: Output, stats: &ringpost_client::StatsResponse) {
    let mut rows = Vec::new();
    for topic in &stats.topics {
        let messages = topic.end_offset - topic.first_offset;
        rows.push((
            vec![
                topic.name.clone(),
                String::new(),
                topic.shard.to_string(),
                messages.to_string(),
                topic.disk_bytes.to_string(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                format!("{} published", topic.published_per_second),
            ],
            json::object(&[
                ("topic", json::string(&topic.name)),
                ("shard", topic.shard.to_string()),
                ("first_offset", topic.first_offset.to_string()),
                ("end_offset", topic.end_offset.to_string()),
                ("messages", messages.to_string()),
                ("disk_bytes", topic.disk_bytes.to_string()),
                ("published_per_second", topic.published_per_second.to_string()),
            ]),
        ));
        for subscription in &topic.subscriptions {
            rows.push((
                vec![
                    topic.name.clone(),
                    subscription.name.clone(),
                    topic.shard.to_string(),
                    String::new(),
                    String::new(),
                    subscription.backlog_messages.to_string(),
                    subscription.outstanding_messages.to_string(),
                    format!("{:.1}", subscription.oldest_unacked_age_ms as f64 / 1000.0),
                    subscription.delivered_total.to_string(),
                    subscription.delivered_per_second.to_string(),
                ],
                json::object(&[
                    ("topic", json::string(&topic.name)),
                    ("subscription", json::string(&subscription.name)),
                    ("backlog", subscription.backlog_messages.to_string()),
                    ("outstanding", subscription.outstanding_messages.to_string()),
                    ("oldest_unacked_age_ms", subscription.oldest_unacked_age_ms.to_string()),
                    ("delivered", subscription.delivered_total.to_string()),
                    ("delivered_per_second", subscription.delivered_per_second.to_string()),
                    ("acked_per_second", subscription.acked_per_second.to_string()),
                    ("expired_deadlines", subscription.expired_total.to_string()),
                ]),
            ));
        }
    }
    print_rows(
        output,
        &[
            "topic",
            "subscription",
            "shard",
            "messages",
            "disk_bytes",
            "backlog",
            "outstanding",
            "oldest_unacked_s",
            "delivered",
            "per_second",
        ],
        rows,
    );
    for shard in &stats.shards {
        let name =
            if shard.shard == u32::MAX { "router".to_string() } else { format!("forwarder-{}", shard.shard) };
        for (index, directory) in shard.directories.iter().enumerate() {
            let state = if directory.fenced.is_empty() {
                "healthy".to_string()
            } else {
                format!("FENCED: {}", directory.fenced)
            };
            match output {
                Output::Json => println!(
                    "{}",
                    json::object(&[
                        ("shard", json::string(&name)),
                        ("directory", index.to_string()),
                        ("path", json::string(&directory.path)),
                        ("healthy", directory.fenced.is_empty().to_string()),
                        ("fenced", json::string(&directory.fenced)),
                        ("repairs", shard.repairs.to_string()),
                    ])
                ),
                Output::Table => println!("{name} directory {index} {}: {state}", directory.path),
            }
        }
        if shard.shard != u32::MAX {
            match output {
                Output::Json => println!(
                    "{}",
                    json::object(&[
                        ("shard", json::string(&name)),
                        ("publish_us", summary_json(&shard.publish_latency)),
                        ("commit_us", summary_json(&shard.commit_latency)),
                    ])
                ),
                Output::Table => {
                    for (kind, summary) in
                        [("publish", &shard.publish_latency), ("commit", &shard.commit_latency)]
                    {
                        println!("{name} {kind} latency, last 10-20 s: {}", latency_text(summary));
                    }
                }
            }
        }
        for topic in &shard.quarantined {
            match output {
                Output::Json => println!(
                    "{}",
                    json::object(&[
                        ("shard", json::string(&name)),
                        ("quarantined_topic", json::string(&topic.name)),
                        ("reason", json::string(&topic.reason)),
                    ])
                ),
                Output::Table => println!("{name} topic '{}': QUARANTINED: {}", topic.name, topic.reason),
            }
        }
    }
    let process = &stats.process;
    match output {
        Output::Json => println!(
            "{}",
            json::object(&[
                ("process", json::string("ringpostd")),
                ("resident_bytes", process.resident_bytes.to_string()),
                ("open_files", process.open_files.to_string()),
                ("open_files_limit", process.open_files_limit.to_string()),
            ])
        ),
        Output::Table => println!(
            "ringpostd: resident {:.1} MiB, {} of {} open files",
            process.resident_bytes as f64 / (1024.0 * 1024.0),
            process.open_files,
            process.open_files_limit
        ),
    }
}

fn latency_text(summary: &ringpost_wire::messages::LatencySummary) -> String {
    if summary.count == 0 {
        return "none".to_string();
    }
    format!(
        "{} measured, p50 {} us, p99 {} us, p99.9 {} us, max {} us",
        summary.count, summary.p50_us, summary.p99_us, summary.p999_us, summary.max_us
    )
}

/// Prints one JSON object per message and returns their ack ids.
fn print_messages(messages: &[ringpost_client::ReceivedMessage], base64: bool) -> Vec<String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let mut ack_ids = Vec::with_capacity(messages.len());
    for message in messages {
        let data = if base64 {
            json::base64(&message.data)
        } else {
            String::from_utf8_lossy(&message.data).into_owned()
        };
        let attributes: Vec<(&str, String)> =
            message.attributes.iter().map(|a| (a.key.as_str(), json::string(&a.value))).collect();
        let mut fields = vec![
            ("message_id", json::string(&message.message_id.to_string())),
            ("data", json::string(&data)),
            ("attributes", json::object(&attributes)),
            ("publish_time", json::string(&json::rfc3339(message.publish_time_ms))),
            ("ack_id", json::string(&message.ack_id)),
            ("delivery_attempt", message.delivery_attempt.to_string()),
        ];
        if !message.ordering_key.is_empty() {
            fields.push(("ordering_key", json::string(&message.ordering_key)));
        }
        let _ = writeln!(out, "{}", json::object(&fields));
        ack_ids.push(message.ack_id.clone());
    }
    let _ = out.flush();
    ack_ids
}

fn topic_json(topic: &Topic) -> String {
    json::object(&[
        ("name", json::string(&topic.name)),
        ("message_retention_seconds", topic.message_retention_seconds.to_string()),
    ])
}

fn subscription_json(subscription: &Subscription) -> String {
    json::object(&[
        ("name", json::string(&subscription.name)),
        ("topic", json::string(&subscription.topic)),
        ("ack_deadline_seconds", subscription.ack_deadline_seconds.to_string()),
        ("retain_acked_messages", subscription.retain_acked_messages.to_string()),
        ("message_retention_seconds", subscription.message_retention_seconds.to_string()),
        ("expiration_ttl_seconds", subscription.expiration_ttl_seconds.to_string()),
        ("enable_message_ordering", subscription.enable_message_ordering.to_string()),
        ("filter", json::string(&subscription.filter)),
        ("dead_letter_topic", json::string(&subscription.dead_letter_topic)),
        ("max_delivery_attempts", subscription.max_delivery_attempts.to_string()),
        ("minimum_backoff_seconds", subscription.minimum_backoff_seconds.to_string()),
        ("maximum_backoff_seconds", subscription.maximum_backoff_seconds.to_string()),
    ])
}

fn print_rows(output: Output, header: &[&str], rows: Vec<(Vec<String>, String)>) {
    match output {
        Output::Json => rows.iter().for_each(|(_, json)| println!("{json}")),
        Output::Table => {
            let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
            for (cells, _) in &rows {
                for (width, cell) in widths.iter_mut().zip(cells) {
                    *width = (*width).max(cell.len());
                }
            }
            let line = |cells: Vec<String>| {
                let padded: Vec<String> =
                    cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
                println!("{}", padded.join("  ").trim_end());
            };
            line(header.iter().map(|h| h.to_uppercase()).collect());
            for (cells, _) in rows {
                line(cells);
            }
        }
    }
}

fn topic_row(topic: &Topic) -> (Vec<String>, String) {
    (vec![topic.name.clone(), topic.message_retention_seconds.to_string()], topic_json(topic))
}

fn subscription_row(subscription: &Subscription) -> (Vec<String>, String) {
    (
        vec![
            subscription.name.clone(),
            subscription.topic.clone(),
            subscription.ack_deadline_seconds.to_string(),
            subscription.retain_acked_messages.to_string(),
        ],
        subscription_json(subscription),
    )
}

const TOPIC_HEADER: [&str; 2] = ["name", "retention_seconds"];
const SUBSCRIPTION_HEADER: [&str; 4] = ["name", "topic", "ack_deadline", "retain_acked"];

fn report_invalid(invalid: Vec<ringpost_client::InvalidAckId>) -> Result<(), Failure> {
    if invalid.is_empty() {
        return Ok(());
    }
    for refused in &invalid {
        eprintln!("InvalidArgument: ack id '{}': {}", refused.ack_id, refused.reason);
    }
    Err(Failure(format!("{} ack id(s) refused", invalid.len()), 1))
}

async fn run(server: &str, flags: Flags) -> Result<(), Failure> {
    let client = Client::connect(server).await?;
    let output = flags.output;
    match flags.command {
        Command::Topic(TopicCommand { action }) => match action {
            TopicAction::Create(create) => {
                let topic = client
                    .create_topic_with(Topic {
                        name: create.name,
                        message_retention_seconds: create.retention.unwrap_or(0),
                    })
                    .await?;
                print_rows(output, &TOPIC_HEADER, vec![topic_row(&topic)]);
            }
            TopicAction::Get(get) => {
                print_rows(output, &TOPIC_HEADER, vec![topic_row(&client.get_topic(&get.name).await?)])
            }
            TopicAction::List(_) => {
                let topics = client.list_topics().await?;
                print_rows(output, &TOPIC_HEADER, topics.iter().map(topic_row).collect());
            }
            TopicAction::Delete(delete) => client.delete_topic(&delete.name).await?,
        },
        Command::Sub(SubCommand { action }) => match action {
            SubAction::Create(create) => {
                let subscription = client
                    .create_subscription(Subscription {
                        name: create.name,
                        topic: create.topic,
                        ack_deadline_seconds: create.ack_deadline,
                        retain_acked_messages: create.retain_acked,
                        message_retention_seconds: create.retention,
                        expiration_ttl_seconds: create.expiration,
                        enable_message_ordering: create.ordering,
                        filter: create.filter,
                        dead_letter_topic: create.dead_letter_topic,
                        max_delivery_attempts: create.max_delivery_attempts,
                        minimum_backoff_seconds: create.min_backoff,
                        maximum_backoff_seconds: create.max_backoff,
                    })
                    .await?;
                print_rows(output, &SUBSCRIPTION_HEADER, vec![subscription_row(&subscription)]);
            }
            SubAction::Get(get) => {
                let subscription = client.get_subscription(&get.name).await?;
                print_rows(output, &SUBSCRIPTION_HEADER, vec![subscription_row(&subscription)]);
            }
            SubAction::List(list) => {
                let subscriptions = client.list_subscriptions(list.topic.as_deref()).await?;
                print_rows(
                    output,
                    &SUBSCRIPTION_HEADER,
                    subscriptions.iter().map(subscription_row).collect(),
                );
            }
            SubAction::Delete(delete) => client.delete_subscription(&delete.name).await?,
            SubAction::Seek(seek) => match (seek.time, seek.snapshot) {
                (Some(time), None) => {
                    let time_ms = json::parse_time(&time)
                        .map_err(|why| Failure(format!("InvalidArgument: --time '{time}': {why}"), 2))?;
                    client.seek(&seek.name, time_ms).await?;
                }
                (None, Some(snapshot)) => client.seek_to_snapshot(&seek.name, &snapshot).await?,
                _ => {
                    return Err(Failure(
                        "InvalidArgument: give exactly one of --time and --snapshot".into(),
                        2,
                    ))
                }
            },
        },
        Command::Publish(publish) => {
            let mut attributes = Vec::new();
            for pair in &publish.attr {
                let Some((key, value)) = pair.split_once('=') else {
                    return Err(Failure(format!("InvalidArgument: --attr '{pair}' is not key=value"), 2));
                };
                attributes.push((key.to_owned(), value.to_owned()));
            }
            let texts = if publish.messages.is_empty() {
                std::io::stdin()
                    .lock()
                    .lines()
                    .collect::<Result<Vec<String>, _>>()
                    .map_err(|e| Failure(format!("reading standard input: {e}"), 2))?
            } else {
                publish.messages
            };
            let messages: Vec<Message> = texts
                .into_iter()
                .map(|text| {
                    attributes.iter().fold(
                        Message::new(text).ordering_key(publish.ordering_key.clone()),
                        |message, (key, value)| message.attribute(key, value),
                    )
                })
                .collect();
            // Requests of at most the protocol's batch limit and about half its byte limit.
            let mut batch = Vec::new();
            let mut batch_bytes = 0;
            let mut batches = Vec::new();
            for message in messages {
                let size = message.0.data.len() + 64;
                if !batch.is_empty()
                    && (batch.len() == ringpost_wire::limits::PUBLISH_BATCH_MESSAGES_MAX
                        || batch_bytes + size > ringpost_wire::limits::PUBLISH_REQUEST_BYTES_MAX / 2)
                {
                    batches.push(std::mem::take(&mut batch));
                    batch_bytes = 0;
                }
                batch_bytes += size;
                batch.push(message);
            }
            if !batch.is_empty() {
                batches.push(batch);
            }
            for batch in batches {
                for id in client.publish(&publish.topic, batch).await? {
                    println!("{id}");
                }
            }
        }
        Command::Pull(pull) => {
            if !(0.0..=60.0).contains(&pull.wait) {
                return Err(Failure("InvalidArgument: --wait must be 0 to 60 seconds".into(), 2));
            }
            if pull.stream {
                let settings = ringpost_client::StreamSettings {
                    max_outstanding_messages: pull.max.max(1) as u64,
                    ..Default::default()
                };
                let mut stream = client.streaming_pull(&pull.subscription, settings).await?;
                while let Some(batch) = stream.next().await {
                    let batch = batch?;
                    let ack_ids = print_messages(&batch, pull.base64);
                    if pull.ack && !ack_ids.is_empty() {
                        report_invalid(client.acknowledge(&pull.subscription, ack_ids).await?)?;
                    }
                }
                return Ok(());
            }
            let messages = client.pull(&pull.subscription, pull.max, (pull.wait * 1000.0) as u32).await?;
            let ack_ids = print_messages(&messages, pull.base64);
            if pull.ack && !ack_ids.is_empty() {
                report_invalid(client.acknowledge(&pull.subscription, ack_ids).await?)?;
            }
        }
        Command::Ack(ack) => report_invalid(client.acknowledge(&ack.subscription, ack.ack_ids).await?)?,
        Command::Nack(nack) => report_invalid(client.nack(&nack.subscription, nack.ack_ids).await?)?,
        Command::Modack(modack) => report_invalid(
            client.modify_ack_deadline(&modack.subscription, modack.ack_ids, modack.seconds).await?,
        )?,
        Command::Stats(_) => print_stats(output, &client.stats().await?),
        Command::Snapshot(SnapshotCommand { action }) => {
            let row = |snapshot: &ringpost_client::Snapshot| {
                (
                    vec![
                        snapshot.name.clone(),
                        snapshot.topic.clone(),
                        json::rfc3339(snapshot.expire_time_ms),
                    ],
                    json::object(&[
                        ("name", json::string(&snapshot.name)),
                        ("topic", json::string(&snapshot.topic)),
                        ("expire_time", json::string(&json::rfc3339(snapshot.expire_time_ms))),
                    ]),
                )
            };
            let header = ["name", "topic", "expire_time"];
            match action {
                SnapshotAction::Create(create) => {
                    let snapshot = client.create_snapshot(&create.name, &create.subscription).await?;
                    print_rows(output, &header, vec![row(&snapshot)]);
                }
                SnapshotAction::List(_) => {
                    let snapshots = client.list_snapshots().await?;
                    print_rows(output, &header, snapshots.iter().map(row).collect());
                }
                SnapshotAction::Delete(delete) => client.delete_snapshot(&delete.name).await?,
            }
        }
        Command::Admin(AdminCommand { action: AdminAction::ResyncDir(resync) }) => {
            let done = client.resync_directory(resync.index).await?;
            println!(
                "{}",
                json::object(&[
                    ("logs_resynced", done.logs_resynced.to_string()),
                    ("batches_copied", done.batches_copied.to_string()),
                ])
            );
        }
    }
    Ok(())
}
