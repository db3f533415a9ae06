//! `ringpost`: the admin and messaging CLI.

use argh::FromArgs;
use ringpost_client::{
    block_on, Client, Error, Message, PoolSettings, StreamEvent, Subscription, Topic, TopicWithSourcePolicy,
    TopicWithSources,
};
use ringpost_tools::bench::report::summary_json;
use ringpost_tools::cli::{self, GlobalOption, EXIT_REFUSED, EXIT_USAGE};
use ringpost_tools::{errln, json, outln};
use ringpost_wire::limits::MESSAGE_BYTES_MAX;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

/// Ringpost's command line: topics, subscriptions, publish, pull, acknowledge.
/// `ringpost --version` prints its version.
#[derive(FromArgs)]
#[argh(
    note = "--server, --output, --timeout and the security options (--token, --ca, --cert, --key, --server-name) may be given anywhere on the line, before or after the command.",
    error_code(1, "the server refused the request; the message starts with its code, e.g. NotFound: topic 'x'"),
    error_code(2, "usage: invalid arguments, options or input, found before anything was sent"),
    error_code(
        3,
        "no Ringpost server answered: cannot connect, the connection failed, --timeout passed, or the port speaks another protocol"
    )
)]
struct Flags {
    /// the router's address (default 127.0.0.1:7450, or $RINGPOST_SERVER)
    #[argh(option)]
    server: Option<String>,
    /// output format of create, get, list, stats and cluster status: json (default, one object
    /// per line) or table; pull, publish and admin always print JSON lines or ids (and say so)
    #[argh(option, default = "Output::Json")]
    output: Output,
    /// seconds each request may take before it fails with DeadlineExceeded, retries included
    /// (default 60; a pull's --wait comes on top; a --stream pull is bounded only while it
    /// opens, and while it opens again after it broke)
    #[argh(option)]
    timeout: Option<f64>,
    /// the token to authenticate with, sent first on every connection (default $RINGPOST_TOKEN)
    #[argh(option)]
    token: Option<String>,
    /// PEM file of the CA that signed the daemon's certificate: connect over TLS, trusting
    /// only it (default $RINGPOST_CA; without either, plaintext)
    #[argh(option)]
    ca: Option<String>,
    /// PEM file of a client certificate to present (mTLS), with --key (default $RINGPOST_CERT)
    #[argh(option)]
    cert: Option<String>,
    /// PEM file of the client certificate's private key (default $RINGPOST_KEY)
    #[argh(option)]
    key: Option<String>,
    /// the name the daemon's certificate must hold (default $RINGPOST_SERVER_NAME, else the
    /// host of each address)
    #[argh(option)]
    server_name: Option<String>,
    #[argh(subcommand)]
    command: Command,
}

/// The options `cli::hoist` takes from anywhere on the command line.
const GLOBAL_OPTIONS: [GlobalOption; 3 + cli::SECURITY_OPTIONS.len()] = {
    let mut options = [GlobalOption { name: "--server", takes_value: true }; 3 + cli::SECURITY_OPTIONS.len()];
    options[1] = GlobalOption { name: "--output", takes_value: true };
    options[2] = GlobalOption { name: "--timeout", takes_value: true };
    let mut index = 0;
    while index < cli::SECURITY_OPTIONS.len() {
        options[3 + index] = cli::SECURITY_OPTIONS[index];
        index += 1;
    }
    options
};

/// The longest `--timeout`: a day, which is "no deadline" for any request a person waits on.
const TIMEOUT_SECONDS_MAX: f64 = 86_400.0;

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
    Cluster(ClusterCommand),
    Admin(AdminCommand),
    Snapshot(SnapshotCommand),
    Schema(SchemaCommand),
    Token(TokenCommand),
    Probe(ProbeCommand),
    Completions(CompletionsCommand),
}

/// print a shell completion script: bash, zsh or fish (for example
/// `ringpost completions bash > /etc/bash_completion.d/ringpost`)
#[derive(FromArgs)]
#[argh(subcommand, name = "completions")]
struct CompletionsCommand {
    /// the shell: bash, zsh or fish
    #[argh(positional)]
    shell: String,
}

/// probe the daemon as a user would: make a subscription of its own on a probe topic, publish
/// one message, time the subscription's creation, the publish's acknowledgement and the
/// delivery, acknowledge, and delete what it made; one JSON line per probe; exit 1 once done if
/// any probe failed or missed an objective
#[derive(FromArgs)]
#[argh(subcommand, name = "probe")]
struct ProbeCommand {
    /// the probe topic, made if missing (default ringpost-probe)
    #[argh(option, default = "String::from(ringpost_tools::probe::PROBE_TOPIC_DEFAULT)")]
    topic: String,
    /// probe again after this long (10s, 500ms, 1m; a bare number is seconds), until --count
    /// probes (default: one probe)
    #[argh(option)]
    every: Option<String>,
    /// how many probes with --every (default: until stopped)
    #[argh(option)]
    count: Option<u64>,
    /// the publish-ack objective, in milliseconds (default 1000)
    #[argh(option, default = "ringpost_tools::probe::PUBLISH_OBJECTIVE_MS_DEFAULT")]
    publish_objective_ms: u64,
    /// the delivery objective, in milliseconds from the publish's start (default 5000)
    #[argh(option, default = "ringpost_tools::probe::DELIVERY_OBJECTIVE_MS_DEFAULT")]
    delivery_objective_ms: u64,
    /// the create-subscription objective, in milliseconds (default 2000)
    #[argh(option, default = "ringpost_tools::probe::CREATE_OBJECTIVE_MS_DEFAULT")]
    create_objective_ms: u64,
    /// serve the probe's figures to Prometheus at http://HOST:PORT/metrics while it runs
    #[argh(option)]
    http_listen: Option<String>,
}

/// make credentials for the daemon's access file (no server is contacted)
#[derive(FromArgs)]
#[argh(subcommand, name = "token")]
struct TokenCommand {
    #[argh(subcommand)]
    action: TokenAction,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum TokenAction {
    Create(TokenCreate),
}

/// make a new random token for principal NAME: prints the token on the first line (give it to
/// the client: --token or RINGPOST_TOKEN) and the access-file line on the second (only the
/// token's SHA-256 goes into the file)
#[derive(FromArgs)]
#[argh(subcommand, name = "create")]
struct TokenCreate {
    /// the principal the token authenticates as (the name grant lines give roles to)
    #[argh(positional)]
    name: String,
    /// when the token stops being accepted, RFC 3339 in UTC: 2027-01-01T00:00:00Z
    #[argh(option)]
    expires: Option<String>,
}

/// show topics, subscriptions (backlog, outstanding, oldest unacked age, idle time,
/// deliveries) and the health of every shard's data directories, of every node of a cluster
#[derive(FromArgs)]
#[argh(subcommand, name = "stats")]
struct StatsCommand {}

/// the cluster, as the node that answers sees it
#[derive(FromArgs)]
#[argh(subcommand, name = "cluster")]
struct ClusterCommand {
    #[argh(subcommand)]
    action: ClusterAction,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum ClusterAction {
    Status(ClusterStatusCommand),
    AddNode(ClusterAddNodeCommand),
    RemoveNode(ClusterRemoveNodeCommand),
    Drain(ClusterDrainCommand),
    Undrain(ClusterUndrainCommand),
    RestrictAdd(ClusterRestrictAddCommand),
    RestrictRemove(ClusterRestrictRemoveCommand),
    RestrictList(ClusterRestrictListCommand),
}

/// add a routing restriction: the clients of a principal (--principal) or of a source range
/// (--from ADDRESS/PREFIX) are handed only the forwarders of --allow's nodes, or none of
/// --deny's. A node denied by any rule that picks a client is never handed to it (deny beats
/// allow); with allow rules, only their nodes are; a client left no forwarder is refused,
/// naming the rules
#[derive(FromArgs)]
#[argh(subcommand, name = "restrict-add")]
struct ClusterRestrictAddCommand {
    #[argh(option)]
    /// the principal the rule is about (a token's name, a certificate's identity, `anonymous`)
    principal: Option<String>,
    #[argh(option)]
    /// the source addresses the rule is about, ADDRESS/PREFIX (10.1.0.0/16, 2001:db8::/32)
    from: Option<String>,
    #[argh(option)]
    /// hand these clients only these nodes' forwarders (ids, comma separated)
    allow: Option<String>,
    #[argh(option)]
    /// never hand these clients these nodes' forwarders (ids, comma separated)
    deny: Option<String>,
}

/// remove a routing restriction, given as it was added
#[derive(FromArgs)]
#[argh(subcommand, name = "restrict-remove")]
struct ClusterRestrictRemoveCommand {
    #[argh(option)]
    /// the rule's principal
    principal: Option<String>,
    #[argh(option)]
    /// the rule's source range
    from: Option<String>,
    #[argh(option)]
    /// the rule's allowed nodes
    allow: Option<String>,
    #[argh(option)]
    /// the rule's denied nodes
    deny: Option<String>,
}

/// list the routing restrictions, in the order they were added
#[derive(FromArgs)]
#[argh(subcommand, name = "restrict-list")]
struct ClusterRestrictListCommand {}

/// A routing rule from the CLI's options: a principal or a range, and allowed or denied nodes.
fn routing_rule(
    principal: Option<String>,
    from: Option<String>,
    allow: Option<String>,
    deny: Option<String>,
) -> Result<ringpost_client::RoutingRule, Failure> {
    let (principal, from) = match (principal, from) {
        (Some(principal), None) => (principal, String::new()),
        (None, Some(from)) => (String::new(), from),
        _ => return Err(Failure::usage("give --principal NAME or --from ADDRESS/PREFIX, one of the two")),
    };
    let (allow, nodes) = match (allow, deny) {
        (Some(nodes), None) => (true, nodes),
        (None, Some(nodes)) => (false, nodes),
        _ => return Err(Failure::usage("give --allow NODES or --deny NODES, one of the two")),
    };
    let nodes = nodes
        .split(',')
        .map(|node| node.trim().parse::<u64>())
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|_| Failure::usage(format!("'{nodes}' is not a list of node ids (2,3)")))?;
    Ok(ringpost_client::RoutingRule { principal, from, allow, nodes })
}

/// drain a node before stopping it: routers stop handing out its forwarders and its topics'
/// leaderships (and the catalog's) move to other nodes; waits, showing progress, until it is
/// empty, or says what is left (a topic of one replica cannot move). It stays drained across
/// restarts until undrained
#[derive(FromArgs)]
#[argh(subcommand, name = "drain")]
struct ClusterDrainCommand {
    /// the node's id
    #[argh(positional)]
    node_id: u64,
    /// how long to wait for the node to be empty, in seconds (default 60; 0: do not wait)
    #[argh(option, default = "60")]
    wait: u64,
}

/// undrain a node: routers hand out its forwarders and placement uses it again; leaderships
/// moved away stay where they are
#[derive(FromArgs)]
#[argh(subcommand, name = "undrain")]
struct ClusterUndrainCommand {
    /// the node's id
    #[argh(positional)]
    node_id: u64,
}

/// add a node to the cluster: start it first with `ringpostd --join --node-id N --cluster ...`
/// (the members' cluster addresses and, at its place, its own); it becomes a learner of the
/// catalog, caught up before this answers, and takes topics once it registered its forwarders
#[derive(FromArgs)]
#[argh(subcommand, name = "add-node")]
struct ClusterAddNodeCommand {
    /// the new node's --node-id
    #[argh(positional)]
    node_id: u64,
    /// where the other nodes reach its cluster port, IP:PORT (its place in its --cluster)
    #[argh(positional)]
    cluster_address: String,
    /// make it a voter of the catalog too (at most 7 voters; 3 or 5 are usual): without it,
    /// a learner, which holds topics but does not vote; adding a learner again with --voter
    /// promotes it
    #[argh(switch)]
    voter: bool,
}

/// remove a node from the cluster (refused while it holds a topic); stop it afterwards. A node
/// that leads the catalog hands the lead to another voter first
#[derive(FromArgs)]
#[argh(subcommand, name = "remove-node")]
struct ClusterRemoveNodeCommand {
    /// the node's id
    #[argh(positional)]
    node_id: u64,
}

/// show the catalog's raft group as the answering node sees it: the node, the catalog's leader,
/// the term and the applied index, then each member: its cluster address, voter or learner, its
/// role and the catalog index the leader knows it holds
#[derive(FromArgs)]
#[argh(subcommand, name = "status")]
struct ClusterStatusCommand {}

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
    Update(TopicUpdate),
}

/// change a topic's settings; only the flags given change
#[derive(FromArgs)]
#[argh(subcommand, name = "update")]
struct TopicUpdate {
    /// the topic
    #[argh(positional)]
    name: String,
    /// keep messages this many seconds even once acknowledged (600 to 2678400; 0 removes the
    /// retention: messages are kept until every subscription acknowledged them)
    #[argh(option)]
    retention: Option<u64>,
    /// raise its number of publish sources to this and keep it (never lowered), or `auto`: the
    /// number follows the topic's publish load, from --sources-min to --sources-max
    #[argh(option)]
    sources: Option<SourcesFlag>,
    /// with --sources auto, the fewest sources (default 1)
    #[argh(option)]
    sources_min: Option<u32>,
    /// with --sources auto, the most sources (default: as many as the cluster can place, within
    /// the daemon's bound)
    #[argh(option)]
    sources_max: Option<u32>,
    /// the schema every message published to it must match from now on (a revision between
    /// --first-revision and --last-revision); the caller needs pubsub.schemas.attach on it
    #[argh(option)]
    schema: Option<String>,
    /// with --schema, how messages are encoded: json (default) or binary
    #[argh(option)]
    encoding: Option<String>,
    /// with --schema, the oldest revision a message may match (default: the first)
    #[argh(option)]
    first_revision: Option<String>,
    /// with --schema, the newest revision a message may match (default: the newest)
    #[argh(option)]
    last_revision: Option<String>,
    /// remove its schema settings: messages are no longer checked
    #[argh(switch)]
    no_schema: bool,
}

/// A topic's schema options as given: its schema, encoding and revision bounds.
struct SchemaOptions<'a> {
    schema: &'a Option<String>,
    encoding: &'a Option<String>,
    first_revision: &'a Option<String>,
    last_revision: &'a Option<String>,
}

/// The schema settings a topic's options give, checked before anything is sent.
fn topic_schema_settings(
    options: SchemaOptions<'_>,
) -> Result<Option<ringpost_client::SchemaSettings>, Failure> {
    let Some(schema) = options.schema else {
        if options.encoding.is_some() || options.first_revision.is_some() || options.last_revision.is_some() {
            return Err(Failure::usage(
                "InvalidArgument: --encoding, --first-revision and --last-revision go with --schema",
            ));
        }
        return Ok(None);
    };
    let encoding = schema_encoding(options.encoding.as_deref().unwrap_or("json"))?;
    Ok(Some(ringpost_client::SchemaSettings {
        schema: schema.clone(),
        encoding: encoding.number(),
        first_revision_id: options.first_revision.clone().unwrap_or_default(),
        last_revision_id: options.last_revision.clone().unwrap_or_default(),
    }))
}

/// `topic create`'s schema settings.
fn created_topic_schema(create: &TopicCreate) -> Result<Option<ringpost_client::SchemaSettings>, Failure> {
    if create.schema.is_some() && create.sources == Some(SourcesFlag::Auto) {
        return Err(Failure::usage("InvalidArgument: --schema does not go with --sources auto yet"));
    }
    topic_schema_settings(SchemaOptions {
        schema: &create.schema,
        encoding: &create.encoding,
        first_revision: &create.first_revision,
        last_revision: &create.last_revision,
    })
}

/// `topic update`'s schema settings: `Some` of empty ones with --no-schema (none from now on).
fn updated_topic_schema(update: &TopicUpdate) -> Result<Option<ringpost_client::SchemaSettings>, Failure> {
    let settings = topic_schema_settings(SchemaOptions {
        schema: &update.schema,
        encoding: &update.encoding,
        first_revision: &update.first_revision,
        last_revision: &update.last_revision,
    })?;
    match (settings, update.no_schema) {
        (Some(_), true) => Err(Failure::usage("InvalidArgument: give --schema or --no-schema, not both")),
        (None, true) => Ok(Some(ringpost_client::SchemaSettings::default())),
        (settings, false) => Ok(settings),
    }
}

/// `--sources N` (a fixed number) or `--sources auto` (the number follows the load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourcesFlag {
    Fixed(u32),
    Auto,
}

impl argh::FromArgValue for SourcesFlag {
    fn from_arg_value(value: &str) -> Result<SourcesFlag, String> {
        if value == "auto" {
            return Ok(SourcesFlag::Auto);
        }
        value.parse().map(SourcesFlag::Fixed).map_err(|_| format!("'{value}' is neither a number nor auto"))
    }
}

/// The bounds `--sources-min` and `--sources-max` give, which only `--sources auto` takes.
fn source_bounds(
    sources: Option<SourcesFlag>,
    min: Option<u32>,
    max: Option<u32>,
) -> Result<(u32, u32), Failure> {
    if sources != Some(SourcesFlag::Auto) && (min.is_some() || max.is_some()) {
        return Err(Failure(
            "InvalidArgument: --sources-min and --sources-max go with --sources auto".into(),
            2,
        ));
    }
    Ok((min.unwrap_or(1), max.unwrap_or(0)))
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
    /// in a cluster, how many nodes hold its messages (odd: 1, 3, 5); a publish is acknowledged
    /// once a majority of them have it (default: the cluster's nodes, at most 3)
    #[argh(option)]
    replicas: Option<u32>,
    /// how many publish sources it has (default 1): each a log of its own with its own leader,
    /// on a forwarder shard of its own, at most as many as the cluster's shards; or `auto`: the
    /// number follows the topic's publish load, from --sources-min to --sources-max
    #[argh(option)]
    sources: Option<SourcesFlag>,
    /// with --sources auto, the fewest sources (default 1)
    #[argh(option)]
    sources_min: Option<u32>,
    /// with --sources auto, the most sources (default: as many as the cluster can place, within
    /// the daemon's bound)
    #[argh(option)]
    sources_max: Option<u32>,
    /// the schema every message published to it must match (a revision between
    /// --first-revision and --last-revision); the caller needs pubsub.schemas.attach on it
    #[argh(option)]
    schema: Option<String>,
    /// with --schema, how messages are encoded: json (default) or binary
    #[argh(option)]
    encoding: Option<String>,
    /// with --schema, the oldest revision a message may match (default: the first)
    #[argh(option)]
    first_revision: Option<String>,
    /// with --schema, the newest revision a message may match (default: the newest)
    #[argh(option)]
    last_revision: Option<String>,
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
    Update(SubUpdate),
    ModifyPushConfig(SubModifyPushConfig),
}

/// `PushFlags` of a command that has the push flags.
macro_rules! push_flags {
    ($command:expr) => {
        PushFlags {
            endpoint: $command.push_endpoint.as_deref(),
            no_wrapper: $command.push_no_wrapper,
            write_metadata: $command.push_write_metadata,
            service_account: $command.push_auth_service_account.as_deref(),
            audience: $command.push_auth_audience.as_deref(),
            project: $command.push_project.as_deref(),
        }
    };
}

/// change a subscription's settings; only the flags given change (the topic, filter and
/// ordering cannot)
#[derive(FromArgs)]
#[argh(subcommand, name = "update")]
struct SubUpdate {
    /// the subscription
    #[argh(positional)]
    name: String,
    /// seconds a message delivered from now on is leased before it is delivered again (10 to
    /// 600; 0 means the default, 10)
    #[argh(option)]
    ack_deadline: Option<u32>,
    /// keep acknowledged messages for the retention period: true or false
    #[argh(option)]
    retain_acked: Option<bool>,
    /// seconds unacknowledged messages are kept (600 to 2678400; 0 means the default, 7 days)
    #[argh(option)]
    retention: Option<u64>,
    /// seconds of inactivity after which the subscription expires (at least 86400; 0 means
    /// the default, 31 days), or never
    #[argh(option)]
    expiration: Option<Expiration>,
    /// topic that receives messages which failed --max-delivery-attempts times (the policy is
    /// set whole: this with the attempts)
    #[argh(option)]
    dead_letter_topic: Option<String>,
    /// deliveries before a message goes to the dead-letter topic (5 to 100; default 5)
    #[argh(option)]
    max_delivery_attempts: Option<u32>,
    /// remove the dead-letter policy
    #[argh(switch)]
    clear_dead_letter: bool,
    /// seconds to wait before redelivering a nacked or expired message, doubling per attempt
    /// (0 to 600, 0: no wait; the policy is set whole: a bound not given takes its default, 10
    /// and 600)
    #[argh(option)]
    min_backoff: Option<u32>,
    /// longest retry backoff in seconds (0 to 600)
    #[argh(option)]
    max_backoff: Option<u32>,
    /// remove the retry policy: failed messages are delivered again at once
    #[argh(switch)]
    clear_retry: bool,
    /// push each message to this http or https URL instead of waiting for pulls (an empty
    /// one: pull)
    #[argh(option)]
    push_endpoint: Option<String>,
    /// push the message's data alone as the body, not Pub/Sub's JSON envelope
    #[argh(switch)]
    push_no_wrapper: bool,
    /// with --push-no-wrapper: the message's attributes and metadata as HTTP headers
    #[argh(switch)]
    push_write_metadata: bool,
    /// push requests carry an OIDC token (a JWT the daemon signs) naming this service account
    #[argh(option)]
    push_auth_service_account: Option<String>,
    /// the token's audience (default: the endpoint's URL)
    #[argh(option)]
    push_auth_audience: Option<String>,
    /// the project push requests name the subscription in, projects/PROJECT/subscriptions/NAME,
    /// as a receiver written for Pub/Sub checks it (default: the one they name now, or ringpost)
    #[argh(option)]
    push_project: Option<String>,
}

impl SubUpdate {
    /// The changes the flags ask for; a refusal names the flags at fault.
    fn changes(&self) -> Result<ringpost_client::SubscriptionUpdate, Failure> {
        let invalid = |text: &str| Err(Failure(format!("InvalidArgument: {text}"), 2));
        let dead_letter_policy =
            match (&self.dead_letter_topic, self.max_delivery_attempts, self.clear_dead_letter) {
                (None, None, false) => None,
                (None, None, true) => Some((String::new(), 0)),
                (Some(topic), attempts, false) => Some((topic.clone(), attempts.unwrap_or(0))),
                (None, Some(_), false) => {
                    return invalid(
                        "--max-delivery-attempts needs --dead-letter-topic: the policy is set whole",
                    )
                }
                (_, _, true) => {
                    return invalid(
                        "--clear-dead-letter goes without --dead-letter-topic and --max-delivery-attempts",
                    )
                }
            };
        let retry_policy = match (self.min_backoff, self.max_backoff, self.clear_retry) {
            (None, None, false) => None,
            (None, None, true) => Some((0, 0)),
            (minimum, maximum, false) => Some(retry_bounds(minimum, maximum)?),
            (_, _, true) => return invalid("--clear-retry goes without --min-backoff and --max-backoff"),
        };
        let changes = ringpost_client::SubscriptionUpdate {
            ack_deadline_seconds: self.ack_deadline,
            retain_acked_messages: self.retain_acked,
            message_retention_seconds: self.retention,
            expiration_ttl_seconds: self.expiration.map(Expiration::ttl_seconds),
            dead_letter_policy,
            retry_policy,
            push: push_flags!(self).config()?,
            push_project: self.push_project.clone(),
        };
        if changes == ringpost_client::SubscriptionUpdate::default() {
            return invalid(
                "nothing to update: give --ack-deadline, --retain-acked, --retention, --expiration, \
                 --dead-letter-topic, --clear-dead-letter, --min-backoff, --max-backoff, --clear-retry \
                 or --push-endpoint",
            );
        }
        Ok(changes)
    }
}

/// `--expiration`: seconds of inactivity, or `never` (Pub/Sub's expiration policy without a
/// ttl).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expiration {
    Seconds(u64),
    Never,
}

impl Expiration {
    /// The subscription's `expiration_ttl_seconds` for it.
    fn ttl_seconds(self) -> u64 {
        match self {
            Expiration::Seconds(seconds) => seconds,
            Expiration::Never => ringpost_wire::limits::EXPIRATION_TTL_SECONDS_NEVER,
        }
    }
}

impl std::str::FromStr for Expiration {
    type Err = String;
    fn from_str(text: &str) -> Result<Expiration, String> {
        if text == "never" {
            return Ok(Expiration::Never);
        }
        match text.parse::<u64>() {
            Ok(seconds) if seconds != ringpost_wire::limits::EXPIRATION_TTL_SECONDS_NEVER => {
                Ok(Expiration::Seconds(seconds))
            }
            _ => Err(format!("'{text}' is neither seconds nor never")),
        }
    }
}

/// A retry policy's bounds as the native protocol carries them, from the flags given: a
/// bound not given takes Pub/Sub's default (10 s, 600 s), so that a minimum of 0 given is 0.
/// Checked here, where it is known which bounds were given, so that a refusal says which
/// value was a default (a usage error: nothing is sent).
fn retry_bounds(minimum: Option<u32>, maximum: Option<u32>) -> Result<(u32, u32), Failure> {
    ringpost_wire::validate::retry_backoff_seconds(minimum, maximum).map_err(|status| {
        let flags = status
            .message
            .replace("minimum_backoff", "--min-backoff")
            .replace("maximum_backoff", "--max-backoff");
        Failure::usage(format!("InvalidArgument: {flags}"))
    })
}

/// A subscription's expiration in JSON: its seconds, or `null` when it never expires.
fn expiration_json(ttl_seconds: u64) -> String {
    match ttl_seconds {
        ringpost_wire::limits::EXPIRATION_TTL_SECONDS_NEVER => "null".to_owned(),
        seconds => seconds.to_string(),
    }
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
    /// seconds of inactivity after which the subscription expires (at least 86400; default 31
    /// days), or never
    #[argh(option)]
    expiration: Option<Expiration>,
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
    /// (0 to 600, 0: no wait; setting either backoff sets a retry policy, default 10)
    #[argh(option)]
    min_backoff: Option<u32>,
    /// longest retry backoff in seconds (0 to 600; default 600 once a retry policy is set)
    #[argh(option)]
    max_backoff: Option<u32>,
    /// push each message to this http or https URL instead of waiting for pulls (an empty
    /// one: pull)
    #[argh(option)]
    push_endpoint: Option<String>,
    /// push the message's data alone as the body, not Pub/Sub's JSON envelope
    #[argh(switch)]
    push_no_wrapper: bool,
    /// with --push-no-wrapper: the message's attributes and metadata as HTTP headers
    #[argh(switch)]
    push_write_metadata: bool,
    /// push requests carry an OIDC token (a JWT the daemon signs) naming this service account
    #[argh(option)]
    push_auth_service_account: Option<String>,
    /// the token's audience (default: the endpoint's URL)
    #[argh(option)]
    push_auth_audience: Option<String>,
    /// the project push requests name the subscription in, projects/PROJECT/subscriptions/NAME,
    /// as a receiver written for Pub/Sub checks it (default: ringpost)
    #[argh(option)]
    push_project: Option<String>,
}

/// change a subscription's push configuration alone: with --push-endpoint it pushes there,
/// without one (or with an empty one) it pulls
#[derive(FromArgs)]
#[argh(subcommand, name = "modify-push-config")]
struct SubModifyPushConfig {
    /// the subscription
    #[argh(positional)]
    name: String,
    /// push each message to this http or https URL instead of waiting for pulls (an empty
    /// one: pull)
    #[argh(option)]
    push_endpoint: Option<String>,
    /// push the message's data alone as the body, not Pub/Sub's JSON envelope
    #[argh(switch)]
    push_no_wrapper: bool,
    /// with --push-no-wrapper: the message's attributes and metadata as HTTP headers
    #[argh(switch)]
    push_write_metadata: bool,
    /// push requests carry an OIDC token (a JWT the daemon signs) naming this service account
    #[argh(option)]
    push_auth_service_account: Option<String>,
    /// the token's audience (default: the endpoint's URL)
    #[argh(option)]
    push_auth_audience: Option<String>,
    /// the project push requests name the subscription in, projects/PROJECT/subscriptions/NAME,
    /// as a receiver written for Pub/Sub checks it (default: the one they name now, or ringpost)
    #[argh(option)]
    push_project: Option<String>,
}

/// The push flags of `sub create`, `sub update` and `sub modify-push-config`, as given.
struct PushFlags<'a> {
    endpoint: Option<&'a str>,
    no_wrapper: bool,
    write_metadata: bool,
    service_account: Option<&'a str>,
    audience: Option<&'a str>,
    project: Option<&'a str>,
}

impl PushFlags<'_> {
    /// The push configuration the flags ask for: `None` when no flag was given, an empty
    /// endpoint for pull. Flags that need another are refused here (a usage error); the
    /// endpoint and the account are the daemon's to check, as for every protocol.
    fn config(&self) -> Result<Option<ringpost_client::PushConfig>, Failure> {
        let invalid = |text: &str| Err(Failure::usage(format!("InvalidArgument: {text}")));
        let Some(endpoint) = self.endpoint else {
            if self.no_wrapper
                || self.write_metadata
                || self.service_account.is_some()
                || self.audience.is_some()
                || self.project.is_some()
            {
                return invalid("the push flags need --push-endpoint");
            }
            return Ok(None);
        };
        if endpoint.is_empty()
            && (self.no_wrapper
                || self.write_metadata
                || self.service_account.is_some()
                || self.audience.is_some()
                || self.project.is_some())
        {
            return invalid("an empty --push-endpoint means pull: give no other push flag with it");
        }
        if self.write_metadata && !self.no_wrapper {
            return invalid(
                "--push-write-metadata goes with --push-no-wrapper: the envelope carries the metadata",
            );
        }
        if self.audience.is_some() && self.service_account.is_none() {
            return invalid(
                "--push-auth-audience needs --push-auth-service-account: the token names the account",
            );
        }
        Ok(Some(ringpost_client::PushConfig {
            endpoint: endpoint.to_owned(),
            attributes: Vec::new(),
            no_wrapper: self.no_wrapper,
            write_metadata: self.write_metadata,
            service_account_email: self.service_account.unwrap_or_default().to_owned(),
            audience: self.audience.unwrap_or_default().to_owned(),
        }))
    }
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
    Get(SnapshotGet),
    List(SnapshotList),
    Delete(SnapshotDelete),
}

/// show a snapshot: its topic and when it expires
#[derive(FromArgs)]
#[argh(subcommand, name = "get")]
struct SnapshotGet {
    #[argh(positional)]
    name: String,
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

/// manage schemas (Pub/Sub's): Avro or Protocol Buffer definitions, with revisions, that a
/// topic's messages must match
#[derive(FromArgs)]
#[argh(subcommand, name = "schema")]
struct SchemaCommand {
    #[argh(subcommand)]
    action: SchemaAction,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum SchemaAction {
    Create(SchemaCreate),
    Get(SchemaGet),
    List(SchemaList),
    Revisions(SchemaRevisions),
    Commit(SchemaCommit),
    Rollback(SchemaRollback),
    Delete(SchemaDelete),
    Validate(SchemaValidate),
    ValidateMessage(SchemaValidateMessage),
}

/// create a schema with its first revision
#[derive(FromArgs)]
#[argh(subcommand, name = "create")]
struct SchemaCreate {
    /// schema name: 3 to 255 characters, starting with a letter
    #[argh(positional)]
    name: String,
    /// avro or protocol-buffer
    #[argh(option, arg_name = "type")]
    r#type: String,
    /// the file holding the definition, or - for standard input
    #[argh(option)]
    definition: String,
}

/// show a schema's newest revision, or NAME@REVISION's
#[derive(FromArgs)]
#[argh(subcommand, name = "get")]
struct SchemaGet {
    #[argh(positional)]
    name: String,
    /// leave the definition out
    #[argh(switch)]
    basic: bool,
}

/// list schemas, each its newest revision
#[derive(FromArgs)]
#[argh(subcommand, name = "list")]
struct SchemaList {
    /// show each definition too
    #[argh(switch)]
    full: bool,
}

/// list a schema's revisions, newest first
#[derive(FromArgs)]
#[argh(subcommand, name = "revisions")]
struct SchemaRevisions {
    #[argh(positional)]
    name: String,
    /// show each definition too
    #[argh(switch)]
    full: bool,
}

/// add a revision to a schema
#[derive(FromArgs)]
#[argh(subcommand, name = "commit")]
struct SchemaCommit {
    #[argh(positional)]
    name: String,
    /// avro or protocol-buffer
    #[argh(option, arg_name = "type")]
    r#type: String,
    /// the file holding the definition, or - for standard input
    #[argh(option)]
    definition: String,
}

/// add a revision to a schema with an older revision's definition
#[derive(FromArgs)]
#[argh(subcommand, name = "rollback")]
struct SchemaRollback {
    #[argh(positional)]
    name: String,
    /// the revision whose definition the new one takes
    #[argh(positional)]
    revision: String,
}

/// delete a schema (its topics then refuse every publish), or NAME@REVISION: one revision
#[derive(FromArgs)]
#[argh(subcommand, name = "delete")]
struct SchemaDelete {
    #[argh(positional)]
    name: String,
}

/// check a definition without keeping it
#[derive(FromArgs)]
#[argh(subcommand, name = "validate")]
struct SchemaValidate {
    /// avro or protocol-buffer
    #[argh(option, arg_name = "type")]
    r#type: String,
    /// the file holding the definition, or - for standard input
    #[argh(option)]
    definition: String,
}

/// check a message against a schema's newest revision, or NAME@REVISION's
#[derive(FromArgs)]
#[argh(subcommand, name = "validate-message")]
struct SchemaValidateMessage {
    #[argh(positional)]
    name: String,
    /// json or binary
    #[argh(option)]
    encoding: String,
    /// the file holding the message, or - for standard input
    #[argh(option)]
    message: String,
}

fn schema_type(text: &str) -> Result<ringpost_client::SchemaType, Failure> {
    ringpost_client::SchemaType::parse(text).ok_or_else(|| {
        Failure::usage(format!("InvalidArgument: --type {text}: give avro or protocol-buffer"))
    })
}

fn schema_encoding(text: &str) -> Result<ringpost_client::SchemaEncoding, Failure> {
    ringpost_client::SchemaEncoding::parse(text)
        .ok_or_else(|| Failure::usage(format!("InvalidArgument: --encoding {text}: give json or binary")))
}

/// The bytes of `path` (`-`: standard input), at most `limit`, for option `option`.
fn read_input(option: &str, path: &str, limit: usize) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    let taken = limit as u64 + 1;
    let read = if path == "-" {
        std::io::stdin().lock().take(taken).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|file| file.take(taken).read_to_end(&mut bytes))
    };
    read.map_err(|error| Failure::usage(format!("InvalidArgument: {option} {path}: {error}")))?;
    if bytes.len() > limit {
        return Err(Failure::usage(format!("InvalidArgument: {option} {path} is over {limit} bytes")));
    }
    Ok(bytes)
}

/// A schema's definition from its file, as text.
fn read_definition(path: &str) -> Result<String, Failure> {
    String::from_utf8(read_input("--definition", path, SCHEMA_DEFINITION_BYTES_MAX)?)
        .map_err(|_| Failure::usage(format!("InvalidArgument: --definition {path} is not UTF-8")))
}

/// The largest definition the daemon keeps (Pub/Sub's limit, 300 KB).
const SCHEMA_DEFINITION_BYTES_MAX: usize = 300_000;

/// What a schema command reads from files, read before connecting: a type, a definition, an
/// encoding and a message, as it takes them.
#[derive(Default)]
struct SchemaInput {
    schema_type: Option<ringpost_client::SchemaType>,
    definition: String,
    encoding: Option<ringpost_client::SchemaEncoding>,
    message: Vec<u8>,
}

fn schema_input(action: &SchemaAction) -> Result<SchemaInput, Failure> {
    let definition = |schema_type: &str, path: &str| -> Result<SchemaInput, Failure> {
        Ok(SchemaInput {
            schema_type: Some(schema_type_of(schema_type)?),
            definition: read_definition(path)?,
            ..SchemaInput::default()
        })
    };
    use schema_type as schema_type_of;
    match action {
        SchemaAction::Create(create) => definition(&create.r#type, &create.definition),
        SchemaAction::Commit(commit) => definition(&commit.r#type, &commit.definition),
        SchemaAction::Validate(validate) => definition(&validate.r#type, &validate.definition),
        SchemaAction::ValidateMessage(validate) => Ok(SchemaInput {
            encoding: Some(schema_encoding(&validate.encoding)?),
            message: read_input("--message", &validate.message, MESSAGE_BYTES_MAX)?,
            ..SchemaInput::default()
        }),
        _ => Ok(SchemaInput::default()),
    }
}

/// A schema's revision as a row: name, type, revision, when it was made (and, in JSON, its
/// definition when it came).
fn schema_row(schema: &ringpost_client::Schema) -> (Vec<String>, String) {
    let schema_type = ringpost_client::SchemaType::name_of(schema.schema_type);
    let created = json::rfc3339(schema.revision_create_time_ms);
    let mut fields = vec![
        ("name", json::string(&schema.name)),
        ("type", json::string(schema_type)),
        ("revision_id", json::string(&schema.revision_id)),
        ("revision_create_time", json::string(&created)),
    ];
    if !schema.definition.is_empty() {
        fields.push(("definition", json::string(&schema.definition)));
    }
    let cells = vec![schema.name.clone(), schema_type.to_owned(), schema.revision_id.clone(), created];
    (cells, json::object(&fields))
}

const SCHEMA_HEADER: [&str; 4] = ["name", "type", "revision_id", "revision_create_time"];

/// `ringpost schema ...`, its files already read (`schema_input`).
async fn run_schema(
    client: &Client,
    output: Output,
    action: SchemaAction,
    input: SchemaInput,
) -> Result<(), Failure> {
    let schema_type = || input.schema_type.expect("read by schema_input");
    let shown = match action {
        SchemaAction::Create(create) => {
            vec![client.create_schema(&create.name, schema_type(), &input.definition).await?]
        }
        SchemaAction::Commit(commit) => {
            vec![client.commit_schema(&commit.name, schema_type(), &input.definition).await?]
        }
        SchemaAction::Get(get) => vec![client.get_schema(&get.name, !get.basic).await?],
        SchemaAction::List(list) => client.list_schemas(list.full).await?,
        SchemaAction::Revisions(revisions) => {
            client.list_schema_revisions(&revisions.name, revisions.full).await?
        }
        SchemaAction::Rollback(rollback) => {
            vec![client.rollback_schema(&rollback.name, &rollback.revision).await?]
        }
        SchemaAction::Delete(delete) => {
            match ringpost_client::schemas::split_revision(&delete.name) {
                (name, "") => client.delete_schema(name).await?,
                (name, revision) => {
                    client.delete_schema_revision(name, revision).await?;
                }
            }
            return Ok(());
        }
        SchemaAction::Validate(_) => {
            client.validate_schema(schema_type(), &input.definition).await?;
            outln!("{}", json::object(&[("valid", "true".to_owned())]));
            return Ok(());
        }
        SchemaAction::ValidateMessage(validate) => {
            let encoding = input.encoding.expect("read by schema_input");
            client.validate_message(&validate.name, encoding, &input.message).await?;
            outln!("{}", json::object(&[("valid", "true".to_owned())]));
            return Ok(());
        }
    };
    print_rows(output, &SCHEMA_HEADER, shown.iter().map(schema_row).collect());
    Ok(())
}

/// A topic with its sources and its schema settings.
fn topic_schema_row(shown: &ringpost_client::TopicWithSchema) -> (Vec<String>, String) {
    with_schema_settings(topic_sources_row(&shown.topic), &shown.schema)
}

/// A topic's row with its schema settings: two more cells, and `schema_settings` in its JSON.
fn with_schema_settings(
    (mut cells, json): (Vec<String>, String),
    settings: &ringpost_client::SchemaSettings,
) -> (Vec<String>, String) {
    let encoding = ringpost_client::SchemaEncoding::name_of(settings.encoding);
    cells.push(settings.schema.clone());
    cells.push(encoding.to_owned());
    let settings_json = json::object(&[
        ("schema", json::string(&settings.schema)),
        ("encoding", json::string(encoding)),
        ("first_revision_id", json::string(&settings.first_revision_id)),
        ("last_revision_id", json::string(&settings.last_revision_id)),
    ]);
    let json = format!("{},\"schema_settings\":{settings_json}}}", json.strip_suffix('}').unwrap_or(&json));
    (cells, json)
}

const TOPIC_SCHEMA_HEADER: [&str; 6] =
    ["name", "retention_seconds", "sources", "leaders", "schema", "encoding"];

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

/// publish messages (arguments, one per line of standard input, or a file) and print their ids,
/// one per line
#[derive(FromArgs)]
#[argh(
    subcommand,
    name = "publish",
    note = "Standard input is read as bytes, one message per line (without its \\n or \\r\\n); it need not be UTF-8. A blank line is skipped, with a note on stderr naming its line number: Pub/Sub refuses a message with neither data nor attributes (publish \"\" as an argument with --attr to send an empty one). Use --file for data that holds line breaks, or --base64.",
    example = "ringpost publish orders --attr region=eu \"order 1\" \"order 2\"",
    example = "ringpost publish images --file photo.jpg",
    example = "printf 'aGVsbG8=\\n' | ringpost publish orders --base64"
)]
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
    /// publish the bytes of this file, as they are, as one message ("-": all of standard input)
    #[argh(option)]
    file: Option<String>,
    /// the messages (arguments or standard input lines) are base64, decoded before publishing:
    /// binary data, line breaks included
    #[argh(switch)]
    base64: bool,
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
    /// print data as base64 (for binary payloads) instead of UTF-8 text; without it, data that
    /// is not UTF-8 is printed as base64 in a field of its own, data_base64
    #[argh(switch)]
    base64: bool,
    /// follow the subscription with a streaming pull until interrupted (--max is then the
    /// stream's window of unacknowledged messages); a stream that breaks (its server died or
    /// restarted) is opened again, for up to --timeout, with a note on standard error
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

/// A failure and the exit code it maps to (see `ringpost_tools::cli` for the scheme).
struct Failure(String, u8);

impl Failure {
    fn usage(text: impl Into<String>) -> Failure {
        Failure(text.into(), EXIT_USAGE)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure(cli::error_line(&error), cli::exit_code(&error))
    }
}

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let arguments = cli::hoist(&arguments, &GLOBAL_OPTIONS);
    let flags: Flags = match cli::parse(&cli::program_name(), &arguments) {
        Ok(flags) => flags,
        Err(code) => return ExitCode::from(code),
    };
    let server = flags
        .server
        .clone()
        .or_else(|| std::env::var("RINGPOST_SERVER").ok())
        .unwrap_or_else(|| "127.0.0.1:7450".to_owned());
    match block_on(run(&server, flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(text, code)) => {
            errln!("{text}");
            ExitCode::from(code)
        }
    }
}

/// The request timeout `--timeout` asks for.
fn request_timeout(seconds: Option<f64>) -> Result<Duration, Failure> {
    let Some(seconds) = seconds else { return Ok(ringpost_client::REQUEST_TIMEOUT_DEFAULT) };
    if !(seconds > 0.0 && seconds <= TIMEOUT_SECONDS_MAX) {
        return Err(Failure::usage(format!(
            "InvalidArgument: --timeout {seconds}: give seconds above 0, at most {TIMEOUT_SECONDS_MAX}"
        )));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// How long `stats` and `cluster status` wait for each node other than the one that answers:
/// a node that does not answer within it is shown as such instead of holding the whole
/// command for its `--timeout` (60 s by default).
const NODE_STATS_WAIT: Duration = Duration::from_secs(5);

/// One node's stats, or why it did not give them.
struct NodeStats {
    node: u64,
    stats: Result<(ringpost_client::StatsResponse, String), String>,
    /// The push subscriptions it pushes (none from a daemon before push subscriptions).
    push: Vec<ringpost_client::PushSubscriptionStats>,
}

/// A node's stats with its push subscriptions', and its version.
async fn node_stats(client: &Client) -> Result<(ringpost_client::StatsWithPushResponse, String), Error> {
    Ok((client.stats_with_push().await?, client.server_version().await?))
}

/// The stats of every node of the cluster the answering node belongs to (its own through
/// `client`, the others' through their routers, as its cluster status lists them, each at
/// most `NODE_STATS_WAIT` and all at once); a node alone gives its own. In node order.
async fn cluster_stats(
    client: &Client,
    timeout: Duration,
    security: &ringpost_client::Security,
) -> Result<Vec<NodeStats>, Failure> {
    let own = node_stats(client).await?;
    let status = client.cluster_status().await?;
    let wait = timeout.min(NODE_STATS_WAIT);
    let others: Vec<(u64, String)> = status
        .nodes
        .iter()
        .filter(|node| node.node_id != status.node_id)
        .map(|node| (node.node_id, node.router_address.clone()))
        .collect();
    let mut gathered: Vec<NodeStats> = std::thread::scope(|scope| {
        let asked: Vec<_> = others
            .into_iter()
            .map(|(node, address)| {
                let security = security.clone();
                let answer = scope.spawn(move || {
                    if address.is_empty() {
                        return Err("its router address is not known yet (it has not registered)".to_owned());
                    }
                    block_on(async {
                        let other =
                            Client::connect_with_security(&address, PoolSettings::default(), wait, security)
                                .await?
                                .with_request_timeout(wait);
                        node_stats(&other).await
                    })
                    .map_err(|error| error.to_string())
                });
                (node, answer)
            })
            .collect();
        asked
            .into_iter()
            .map(|(node, answer)| {
                let answer = answer.join().unwrap_or_else(|_| Err("asking it failed".to_owned()));
                node_answer(node, answer)
            })
            .collect()
    });
    gathered.push(node_answer(status.node_id, Ok(own)));
    gathered.sort_by_key(|node| node.node);
    Ok(gathered)
}

fn node_answer(
    node: u64,
    answer: Result<(ringpost_client::StatsWithPushResponse, String), String>,
) -> NodeStats {
    match answer {
        Ok((answer, version)) => {
            NodeStats { node, stats: Ok((answer.stats, version)), push: answer.push_subscriptions }
        }
        Err(why) => NodeStats { node, stats: Err(why), push: Vec::new() },
    }
}

/// Topics of several rows in `ringpost stats` whose sources it looks up, in name order; the
/// rest are shown without their source. A lookup is one small request, so this keeps a
/// listing of many replicated topics within about a second more.
const STATS_SOURCE_LOOKUPS_MAX: usize = 1000;

/// Which source each topic row of a topic of several sources is, by (topic, node, shard): the
/// source whose leader is there (a shard holds at most one source of a topic). Only topics
/// shown on more than one row are asked about (a topic of several sources has a row per
/// source), so that a listing of topics of one source costs no request more; a topic whose
/// lookup fails, or that has one source, is shown as before.
async fn row_sources(client: &Client, nodes: &[NodeStats]) -> HashMap<(String, u64, u32), u32> {
    let mut rows: BTreeMap<&str, usize> = BTreeMap::new();
    for node in nodes {
        let Ok((stats, _)) = &node.stats else { continue };
        for topic in &stats.topics {
            *rows.entry(topic.name.as_str()).or_default() += 1;
        }
    }
    let mut sources = HashMap::new();
    let several = rows.into_iter().filter(|(_, count)| *count > 1).map(|(name, _)| name);
    for name in several.take(STATS_SOURCE_LOOKUPS_MAX) {
        let Ok(topic) = client.get_topic_with_sources(name).await else { continue };
        if topic.sources.len() < 2 {
            continue;
        }
        for source in &topic.sources {
            sources.insert((name.to_owned(), source.leader_node, source.leader_shard), source.number);
        }
    }
    sources
}

/// `ringpost stats`: every node's topics and subscriptions in one table (a `node` column),
/// then each node's replicas, push subscriptions, data directories, latencies and process; a
/// node that did not answer is said so. Each JSON line names what it describes (`kind`: topic,
/// subscription, replica, push, directory, latency, quarantined, process, node) and the node it comes from, after
/// the fields it always had. A row of a topic of several sources names its source (`row_sources`:
/// the source whose leader is the row's node and shard); a topic of one source shows a dash.
fn print_stats(output: Output, nodes: &[NodeStats], sources: &HashMap<(String, u64, u32), u32>) {
    let mut rows = Vec::new();
    let dash = || "-".to_owned();
    for node in nodes {
        let Ok((stats, _)) = &node.stats else { continue };
        let id = node.node.to_string();
        for topic in &stats.topics {
            let source = sources.get(&(topic.name.clone(), node.node, topic.shard));
            let source_cell = source.map_or_else(dash, |source| source.to_string());
            let messages = topic.end_offset - topic.first_offset;
            let role =
                topic.replication.as_ref().map(|replica| if replica.leader { "leader" } else { "follower" });
            let mut fields = vec![
                ("topic", json::string(&topic.name)),
                ("shard", topic.shard.to_string()),
                ("first_offset", topic.first_offset.to_string()),
                ("end_offset", topic.end_offset.to_string()),
                ("messages", messages.to_string()),
                ("disk_bytes", topic.disk_bytes.to_string()),
                ("published_per_second", topic.published_per_second.to_string()),
            ];
            if let Some(role) = role {
                fields.push(("replica", json::string(role)));
            }
            if let Some(source) = source {
                fields.push(("source", source.to_string()));
            }
            fields.extend([("kind", json::string("topic")), ("node", id.clone())]);
            rows.push((
                vec![
                    id.clone(),
                    topic.name.clone(),
                    source_cell.clone(),
                    dash(),
                    topic.shard.to_string(),
                    role.unwrap_or("-").to_owned(),
                    messages.to_string(),
                    topic.disk_bytes.to_string(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                    topic.published_per_second.to_string(),
                    dash(),
                ],
                json::object(&fields),
            ));
            for subscription in &topic.subscriptions {
                let mut fields = vec![
                    ("topic", json::string(&topic.name)),
                    ("subscription", json::string(&subscription.name)),
                    ("backlog", subscription.backlog_messages.to_string()),
                    ("outstanding", subscription.outstanding_messages.to_string()),
                    ("oldest_unacked_age_ms", subscription.oldest_unacked_age_ms.to_string()),
                    ("idle_ms", subscription.idle_ms.to_string()),
                    ("delivered", subscription.delivered_total.to_string()),
                    ("delivered_per_second", subscription.delivered_per_second.to_string()),
                    ("acked_per_second", subscription.acked_per_second.to_string()),
                    ("expired_deadlines", subscription.expired_total.to_string()),
                ];
                if let Some(source) = source {
                    fields.push(("source", source.to_string()));
                }
                fields.extend([("kind", json::string("subscription")), ("node", id.clone())]);
                rows.push((
                    vec![
                        id.clone(),
                        topic.name.clone(),
                        source_cell.clone(),
                        subscription.name.clone(),
                        topic.shard.to_string(),
                        role.unwrap_or("-").to_owned(),
                        dash(),
                        dash(),
                        subscription.backlog_messages.to_string(),
                        subscription.outstanding_messages.to_string(),
                        format!("{:.1}", subscription.oldest_unacked_age_ms as f64 / 1000.0),
                        format!("{:.1}", subscription.idle_ms as f64 / 1000.0),
                        subscription.delivered_total.to_string(),
                        dash(),
                        subscription.delivered_per_second.to_string(),
                    ],
                    json::object(&fields),
                ));
            }
        }
    }
    print_rows(
        output,
        &[
            "node",
            "topic",
            "source",
            "subscription",
            "shard",
            "replica",
            "messages",
            "disk_bytes",
            "backlog",
            "outstanding",
            "oldest_unacked_s",
            "idle_s",
            "delivered",
            "published_per_s",
            "delivered_per_s",
        ],
        rows,
    );
    print_replicas(output, nodes);
    print_pushes(output, nodes);
    for node in nodes {
        let id = node.node.to_string();
        let (stats, version) = match &node.stats {
            Ok(answered) => answered,
            Err(why) => {
                match output {
                    Output::Json => outln!(
                        "{}",
                        json::object(&[
                            ("answered", "false".to_owned()),
                            ("error", json::string(why)),
                            ("kind", json::string("node")),
                            ("node", id),
                        ])
                    ),
                    Output::Table => outln!("node {id}: DID NOT ANSWER: {why}"),
                }
                continue;
            }
        };
        print_node_shards(output, &id, stats);
        let process = &stats.process;
        match output {
            Output::Json => outln!(
                "{}",
                json::object(&[
                    ("process", json::string("ringpostd")),
                    ("version", json::string(version)),
                    ("resident_bytes", process.resident_bytes.to_string()),
                    ("open_files", process.open_files.to_string()),
                    ("open_files_limit", process.open_files_limit.to_string()),
                    ("kind", json::string("process")),
                    ("node", id),
                ])
            ),
            Output::Table => outln!(
                "node {id}: ringpostd {version}: resident {:.1} MiB, {} of {} open files",
                process.resident_bytes as f64 / (1024.0 * 1024.0),
                process.open_files,
                process.open_files_limit
            ),
        }
    }
}

/// One node's shards: every data directory's health, each forwarder's latencies, its
/// quarantined topics.
fn print_node_shards(output: Output, id: &str, stats: &ringpost_client::StatsResponse) {
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
                Output::Json => outln!(
                    "{}",
                    json::object(&[
                        ("shard", json::string(&name)),
                        ("directory", index.to_string()),
                        ("path", json::string(&directory.path)),
                        ("healthy", directory.fenced.is_empty().to_string()),
                        ("fenced", json::string(&directory.fenced)),
                        ("repairs", shard.repairs.to_string()),
                        ("kind", json::string("directory")),
                        ("node", id.to_owned()),
                    ])
                ),
                Output::Table => outln!("node {id} {name} directory {index} {}: {state}", directory.path),
            }
        }
        if shard.shard != u32::MAX {
            match output {
                Output::Json => outln!(
                    "{}",
                    json::object(&[
                        ("shard", json::string(&name)),
                        ("publish_us", summary_json(&shard.publish_latency)),
                        ("commit_us", summary_json(&shard.commit_latency)),
                        ("kind", json::string("latency")),
                        ("node", id.to_owned()),
                    ])
                ),
                Output::Table => {
                    for (kind, summary) in
                        [("publish", &shard.publish_latency), ("commit", &shard.commit_latency)]
                    {
                        outln!("node {id} {name} {kind} latency, last 10-20 s: {}", latency_text(summary));
                    }
                }
            }
        }
        for topic in &shard.quarantined {
            match output {
                Output::Json => outln!(
                    "{}",
                    json::object(&[
                        ("shard", json::string(&name)),
                        ("quarantined_topic", json::string(&topic.name)),
                        ("reason", json::string(&topic.reason)),
                        ("kind", json::string("quarantined")),
                        ("node", id.to_owned()),
                    ])
                ),
                Output::Table => {
                    outln!("node {id} {name} topic '{}': QUARANTINED: {}", topic.name, topic.reason)
                }
            }
        }
    }
}

/// The replicas of replicated topics on every node that answered: a row per follower as its
/// leader last heard from it, and a row per replica that follows. Nothing when every topic has
/// one replica.
fn print_replicas(output: Output, nodes: &[NodeStats]) {
    let mut rows = Vec::new();
    for node in nodes {
        let Ok((stats, _)) = &node.stats else { continue };
        let id = node.node.to_string();
        for topic in &stats.topics {
            let Some(replica) = &topic.replication else { continue };
            let role = if replica.leader { "leader" } else { "follower" };
            let common = |follower: Option<&ringpost_client::FollowerStats>| {
                // The follower's node and forwarder, as the catalog numbers them.
                let place = follower.map(|f| ringpost_model::shards::node_and_shard(f.shard));
                let cells = vec![
                    id.clone(),
                    topic.name.clone(),
                    role.to_owned(),
                    replica.epoch.to_string(),
                    replica.durable_end.to_string(),
                    replica.committed_end.to_string(),
                    place.map_or_else(|| "-".to_owned(), |(node, forwarder)| format!("{node}/{forwarder}")),
                    follower.map_or_else(|| "-".to_owned(), |f| f.durable_end.to_string()),
                    follower.map_or_else(|| "-".to_owned(), |f| f.lag_messages.to_string()),
                    follower.map_or_else(|| "-".to_owned(), |f| f.journal_lag_entries.to_string()),
                    follower
                        .and_then(|f| f.answered_ms_ago)
                        .map_or_else(|| "-".to_owned(), |ago| ago.to_string()),
                ];
                let mut fields = vec![
                    ("topic", json::string(&topic.name)),
                    ("role", json::string(role)),
                    ("epoch", replica.epoch.to_string()),
                    ("durable_end", replica.durable_end.to_string()),
                    ("committed_end", replica.committed_end.to_string()),
                ];
                if let (Some(follower), Some((node, forwarder))) = (follower, place) {
                    fields.push(("follower_node", node.to_string()));
                    fields.push(("follower_forwarder", forwarder.to_string()));
                    fields.push(("follower_address", json::string(&follower.address)));
                    fields.push(("follower_durable_end", follower.durable_end.to_string()));
                    fields.push(("lag_messages", follower.lag_messages.to_string()));
                    fields.push(("journal_lag_entries", follower.journal_lag_entries.to_string()));
                    fields.push((
                        "answered_ms_ago",
                        follower.answered_ms_ago.map_or_else(|| "null".to_owned(), |ago| ago.to_string()),
                    ));
                }
                fields.extend([("kind", json::string("replica")), ("node", id.clone())]);
                (cells, json::object(&fields))
            };
            if replica.followers.is_empty() {
                rows.push(common(None));
            }
            for follower in &replica.followers {
                rows.push(common(Some(follower)));
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    print_rows(
        output,
        &[
            "node",
            "topic",
            "replica",
            "epoch",
            "durable_end",
            "committed_end",
            "follower",
            "follower_end",
            "lag",
            "journal_lag",
            "answered_ms_ago",
        ],
        rows,
    );
}

/// The push subscriptions every node that answered pushes: a row each with its endpoint, window,
/// pushes outstanding, backlog, failures since the last push acknowledged, and the last push
/// that did not acknowledge with how long ago (kept after later successes). Nothing when no
/// subscription pushes.
fn print_pushes(output: Output, nodes: &[NodeStats]) {
    let mut rows = Vec::new();
    for node in nodes {
        let Ok((stats, _)) = &node.stats else { continue };
        let id = node.node.to_string();
        for push in &node.push {
            let backlog = stats
                .topics
                .iter()
                .filter(|topic| topic.name == push.topic)
                .flat_map(|topic| &topic.subscriptions)
                .find(|subscription| subscription.name == push.subscription)
                .map_or(0, |subscription| subscription.backlog_messages);
            let error = push.last_error.as_ref();
            let requests: Vec<(&str, String)> =
                push.requests.iter().map(|count| (count.class.as_str(), count.count.to_string())).collect();
            rows.push((
                vec![
                    id.clone(),
                    push.topic.clone(),
                    push.subscription.clone(),
                    push.endpoint.clone(),
                    push.window.to_string(),
                    push.outstanding.to_string(),
                    backlog.to_string(),
                    push.failures_in_a_row.to_string(),
                    error.map_or_else(
                        || "-".to_owned(),
                        |error| format!("{:.1}", error.ms_ago as f64 / 1000.0),
                    ),
                    error.map_or_else(|| "-".to_owned(), |error| error.reason.clone()),
                ],
                json::object(&[
                    ("topic", json::string(&push.topic)),
                    ("subscription", json::string(&push.subscription)),
                    ("endpoint", json::string(&push.endpoint)),
                    ("window", push.window.to_string()),
                    ("outstanding", push.outstanding.to_string()),
                    ("backlog", backlog.to_string()),
                    ("failures_in_a_row", push.failures_in_a_row.to_string()),
                    (
                        "last_error",
                        error.map_or_else(|| "null".to_owned(), |error| json::string(&error.reason)),
                    ),
                    (
                        "last_error_ms_ago",
                        error.map_or_else(|| "null".to_owned(), |error| error.ms_ago.to_string()),
                    ),
                    ("requests", json::object(&requests)),
                    ("kind", json::string("push")),
                    ("node", id.clone()),
                ]),
            ));
        }
    }
    if rows.is_empty() {
        return;
    }
    print_rows(
        output,
        &[
            "node",
            "topic",
            "subscription",
            "endpoint",
            "window",
            "outstanding",
            "backlog",
            "failures_in_a_row",
            "last_error_s_ago",
            "last_error",
        ],
        rows,
    );
}

/// A replicated topic's leader as its own node's stats tell: what a quorum holds, and how far
/// the furthest follower lags.
struct ReplicaLag {
    committed_end: u64,
    lag_messages_max: u64,
}

/// Each replicated topic's lag, from the stats of every node (`cluster_stats`); a node that
/// did not answer leaves its topics' lag unknown. Keyed by the topic's short name.
fn replica_lags(nodes: &[NodeStats]) -> std::collections::HashMap<String, ReplicaLag> {
    let mut lags = std::collections::HashMap::new();
    for node in nodes {
        let Ok((stats, _)) = &node.stats else { continue };
        for topic in &stats.topics {
            let Some(replica) = topic.replication.as_ref().filter(|replica| replica.leader) else { continue };
            let lag_messages_max =
                replica.followers.iter().map(|follower| follower.lag_messages).max().unwrap_or(0);
            lags.insert(
                short_name(&topic.name).to_owned(),
                ReplicaLag { committed_end: replica.committed_end, lag_messages_max },
            );
        }
    }
    lags
}

/// A topic's name without its `projects/P/topics/` prefix.
fn short_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// How often `ringpost cluster drain` looks whether the node is empty yet.
const DRAIN_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What a draining node still holds, in a few words ("empty" once it holds nothing).
fn drain_left(drain: &ringpost_client::NodeDrainStatus) -> String {
    let mut left = Vec::new();
    if drain.leaderships > 0 {
        left.push(format!("leads {} replicated topic(s)", drain.leaderships));
    }
    if drain.leads_catalog {
        left.push("leads the catalog".to_owned());
    }
    if drain.single_replica_count > 0 {
        let more = drain.single_replica_count as usize > drain.single_replica_topics.len();
        left.push(format!(
            "holds {} topic(s) of one replica, which cannot move without their data ({}{})",
            drain.single_replica_count,
            drain.single_replica_topics.join(", "),
            if more { ", ..." } else { "" }
        ));
    }
    if left.is_empty() {
        "empty".to_owned()
    } else {
        left.join("; ")
    }
}

/// Waits up to `wait` for draining node `node_id` to be empty, a line on stderr each time what
/// it holds changes; refused with what is left when it is not empty by then, or when only
/// topics of one replica are left (nothing more will move).
async fn wait_drained(client: &Client, node_id: u64, wait: Duration) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    let mut shown = String::new();
    loop {
        let drains = client.drain_status().await?;
        let Some(drain) = drains.nodes.iter().find(|drain| drain.node_id == node_id) else {
            return Err(Failure(
                format!("node {node_id} is not draining (undrained meanwhile?)"),
                EXIT_REFUSED,
            ));
        };
        let left = drain_left(drain);
        if left == "empty" {
            outln!("{}", json::object(&[("node_id", node_id.to_string()), ("drained", "true".to_owned())]));
            return Ok(());
        }
        let only_single = drain.leaderships == 0 && !drain.leads_catalog;
        if only_single || started.elapsed() >= wait {
            return Err(Failure(
                format!("node {node_id} is draining, not yet empty: it {left}"),
                EXIT_REFUSED,
            ));
        }
        if left != shown {
            errln!("node {node_id} draining: {left}");
            shown = left;
        }
        ringpost_client::sleep(DRAIN_POLL_INTERVAL).await;
    }
}

/// The draining nodes under `ringpost cluster status`, if any.
fn print_drains(output: Output, drains: &[ringpost_client::NodeDrainStatus]) {
    if drains.is_empty() {
        return;
    }
    let rows = drains
        .iter()
        .map(|drain| {
            (
                vec![drain.node_id.to_string(), drain_left(drain)],
                json::object(&[
                    ("draining_node", drain.node_id.to_string()),
                    ("leaderships", drain.leaderships.to_string()),
                    ("leads_catalog", drain.leads_catalog.to_string()),
                    ("single_replica_topics", drain.single_replica_count.to_string()),
                    ("empty", (drain_left(drain) == "empty").to_string()),
                ]),
            )
        })
        .collect();
    print_rows(output, &["draining_node", "left"], rows);
}

/// `ringpost cluster status`: the answering node's view first (a line of its own), then one row
/// per member, then one per replicated topic with its leader's lag when its node answered.
/// JSON leaves an unknown value `null`; the table says `none` (a leader, an index) or `-` (a
/// member's value).
fn print_cluster_status(
    output: Output,
    status: &ringpost_client::ClusterStatusResponse,
    lags: &std::collections::HashMap<String, ReplicaLag>,
) {
    let known =
        |value: Option<u64>, unknown: &str| value.map_or_else(|| unknown.to_owned(), |v| v.to_string());
    let mut answering = vec![
        ("answering_node", status.node_id.to_string()),
        ("catalog_leader", known(status.catalog_leader, "null")),
        ("term", status.term.to_string()),
        ("last_log_index", known(status.last_log_index, "null")),
        ("last_applied_index", known(status.last_applied_index, "null")),
        ("not_serving", status.not_serving.as_deref().map_or_else(|| "null".to_owned(), json::string)),
    ];
    if !status.note.is_empty() {
        answering.push(("view", json::string(&status.note)));
    }
    match output {
        Output::Json => outln!("{}", json::object(&answering)),
        Output::Table => {
            outln!(
                "node {} answering: catalog leader {}, term {}, applied index {}",
                status.node_id,
                known(status.catalog_leader, "none"),
                status.term,
                known(status.last_applied_index, "none"),
            );
            if let Some(why) = &status.not_serving {
                outln!("NOT SERVING: {why}");
            }
            if !status.note.is_empty() {
                outln!("roles and liveness: {}", status.note);
            }
        }
    }
    let rows = status
        .nodes
        .iter()
        .map(|node| {
            let address = if node.cluster_address.is_empty() { "-" } else { node.cluster_address.as_str() };
            // Seconds since the leader last heard from it, as the leader sees it.
            let heard = node.heard_ms_ago.map(|ago| format!("{:.1}", ago as f64 / 1000.0));
            (
                vec![
                    node.node_id.to_string(),
                    address.to_owned(),
                    if node.voter { "voter" } else { "learner" }.to_owned(),
                    node.role.clone(),
                    known(node.matched_index, "-"),
                    heard.unwrap_or_else(|| "-".to_owned()),
                ],
                json::object(&[
                    ("node", node.node_id.to_string()),
                    ("cluster_address", json::string(&node.cluster_address)),
                    ("voter", node.voter.to_string()),
                    ("role", json::string(&node.role)),
                    ("matched_index", known(node.matched_index, "null")),
                    ("heard_ms_ago", known(node.heard_ms_ago, "null")),
                ]),
            )
        })
        .collect();
    print_rows(output, &["node", "cluster_address", "member", "role", "matched_index", "last_heard_s"], rows);
    let topics: Vec<_> = status
        .topics
        .iter()
        .map(|topic| {
            let replicas: Vec<String> = topic.replica_nodes.iter().map(u64::to_string).collect();
            let lag = lags.get(short_name(&topic.name));
            let committed = lag.map(|lag| lag.committed_end);
            let behind = lag.map(|lag| lag.lag_messages_max);
            (
                vec![
                    topic.name.clone(),
                    topic.leader_node.to_string(),
                    topic.epoch.to_string(),
                    replicas.join(","),
                    known(committed, "-"),
                    known(behind, "-"),
                ],
                json::object(&[
                    ("topic", json::string(&topic.name)),
                    ("leader_node", topic.leader_node.to_string()),
                    ("epoch", topic.epoch.to_string()),
                    ("replica_nodes", format!("[{}]", replicas.join(","))),
                    ("committed_end", known(committed, "null")),
                    ("lag_messages_max", known(behind, "null")),
                ]),
            )
        })
        .collect::<Vec<_>>();
    // Where topics live tells nothing on a node alone.
    if !topics.is_empty() && status.nodes.len() > 1 {
        print_rows(
            output,
            &["topic", "leader_node", "epoch", "replica_nodes", "committed_end", "lag_messages_max"],
            topics,
        );
    }
    if status.topics_omitted > 0 && status.nodes.len() > 1 {
        match output {
            Output::Json => {
                outln!("{}", json::object(&[("topics_omitted", status.topics_omitted.to_string())]))
            }
            Output::Table => outln!("... and {} more topics", status.topics_omitted),
        }
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

/// Prints one JSON object per message and returns their ack ids. Data is UTF-8 text in
/// `data`, or base64 in `data` with `--base64`. Without it, data that is not UTF-8 is printed
/// whole as base64 in `data_base64` instead of `data` (a reader of `data` finds it missing
/// rather than reading damaged text), with a note on standard error, so that `--ack` never
/// acknowledges a message whose bytes were not shown.
fn print_messages(messages: &[ringpost_client::ReceivedMessage], base64: bool) -> Vec<String> {
    let mut out = String::new();
    let mut ack_ids = Vec::with_capacity(messages.len());
    let mut not_text = Vec::new();
    for message in messages {
        let (field, data) = match (base64, std::str::from_utf8(&message.data)) {
            (true, _) => ("data", json::base64(&message.data)),
            (false, Ok(text)) => ("data", text.to_owned()),
            (false, Err(_)) => {
                not_text.push(message.message_id.to_string());
                ("data_base64", json::base64(&message.data))
            }
        };
        let attributes: Vec<(&str, String)> =
            message.attributes.iter().map(|a| (a.key.as_str(), json::string(&a.value))).collect();
        let mut fields = vec![
            ("message_id", json::string(&message.message_id.to_string())),
            (field, json::string(&data)),
            ("attributes", json::object(&attributes)),
            ("publish_time", json::string(&json::rfc3339(message.publish_time_ms))),
            ("ack_id", json::string(&message.ack_id)),
            ("delivery_attempt", message.delivery_attempt.to_string()),
        ];
        if !message.ordering_key.is_empty() {
            fields.push(("ordering_key", json::string(&message.ordering_key)));
        }
        out.push_str(&json::object(&fields));
        out.push('\n');
        ack_ids.push(message.ack_id.clone());
    }
    if !not_text.is_empty() {
        errln!(
            "note: the data of message(s) {} is not UTF-8: printed as base64 in data_base64 (--base64 prints all data so)",
            not_text.join(", ")
        );
    }
    // One write for the batch; a closed pipe ends the program before anything is acknowledged.
    cli::print_out(format_args!("{out}"));
    ack_ids
}

fn topic_json(topic: &Topic) -> String {
    json::object(&[
        ("name", json::string(&topic.name)),
        ("message_retention_seconds", topic.message_retention_seconds.to_string()),
    ])
}

fn subscription_json(subscription: &Subscription) -> String {
    json::object(&subscription_fields(subscription))
}

/// A subscription's fields in JSON, each name with its encoded value.
fn subscription_fields(subscription: &Subscription) -> Vec<(&'static str, String)> {
    vec![
        ("name", json::string(&subscription.name)),
        ("topic", json::string(&subscription.topic)),
        ("ack_deadline_seconds", subscription.ack_deadline_seconds.to_string()),
        ("retain_acked_messages", subscription.retain_acked_messages.to_string()),
        ("message_retention_seconds", subscription.message_retention_seconds.to_string()),
        ("expiration_ttl_seconds", expiration_json(subscription.expiration_ttl_seconds)),
        ("enable_message_ordering", subscription.enable_message_ordering.to_string()),
        ("filter", json::string(&subscription.filter)),
        ("dead_letter_topic", json::string(&subscription.dead_letter_topic)),
        ("max_delivery_attempts", subscription.max_delivery_attempts.to_string()),
        ("minimum_backoff_seconds", subscription.minimum_backoff_seconds.to_string()),
        ("maximum_backoff_seconds", subscription.maximum_backoff_seconds.to_string()),
    ]
}

fn print_rows(output: Output, header: &[&str], rows: Vec<(Vec<String>, String)>) {
    match output {
        Output::Json => rows.iter().for_each(|(_, json)| outln!("{json}")),
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
                outln!("{}", padded.join("  ").trim_end());
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

/// A topic with its sources: how many, and each one's leader as `node/shard`, source 0 first
/// (a daemon from before sources lists none: one source).
fn topic_sources_row(shown: &TopicWithSources) -> (Vec<String>, String) {
    let leaders: Vec<String> = shown
        .sources
        .iter()
        .map(|source| format!("{}/{}", source.leader_node, source.leader_shard))
        .collect();
    let sources: Vec<String> = shown
        .sources
        .iter()
        .map(|source| {
            json::object(&[
                ("number", source.number.to_string()),
                ("leader_node", source.leader_node.to_string()),
                ("leader_shard", source.leader_shard.to_string()),
            ])
        })
        .collect();
    let json = json::object(&[
        ("name", json::string(&shown.topic.name)),
        ("message_retention_seconds", shown.topic.message_retention_seconds.to_string()),
        ("sources", format!("[{}]", sources.join(","))),
    ]);
    let count = shown.sources.len().max(1);
    let cells = vec![
        shown.topic.name.clone(),
        shown.topic.message_retention_seconds.to_string(),
        count.to_string(),
        if leaders.is_empty() { "-".to_owned() } else { leaders.join(",") },
    ];
    (cells, json)
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
const TOPIC_SOURCES_HEADER: [&str; 4] = ["name", "retention_seconds", "sources", "leaders"];
const TOPIC_POLICY_HEADER: [&str; 5] = ["name", "retention_seconds", "sources", "leaders", "policy"];

/// A topic with its sources and whether their number follows its load: `topic_sources_row`
/// with the policy, `fixed` or `auto MIN-MAX`.
fn topic_policy_row(shown: &TopicWithSourcePolicy) -> (Vec<String>, String) {
    let (mut cells, json) = topic_sources_row(&shown.topic);
    let policy = if shown.auto {
        format!("auto {}-{}", shown.sources_min, shown.sources_max)
    } else {
        "fixed".to_owned()
    };
    cells.push(policy);
    let policy_json = json::object(&[
        ("auto", shown.auto.to_string()),
        ("min", shown.sources_min.to_string()),
        ("max", shown.sources_max.to_string()),
    ]);
    let json = format!("{},\"source_policy\":{policy_json}}}", json.strip_suffix('}').unwrap_or(&json));
    (cells, json)
}
const SUBSCRIPTION_HEADER: [&str; 4] = ["name", "topic", "ack_deadline", "retain_acked"];
const SUBSCRIPTION_WITH_PUSH_HEADER: [&str; 5] = ["name", "topic", "ack_deadline", "retain_acked", "push"];

/// What `sub get` says a plain http endpoint is: its requests, their tokens and messages cross
/// the network in the clear.
const PUSH_NOT_ENCRYPTED: &str = "not encrypted";

/// Whether pushes to `endpoint` go in the clear (`http://`, as Pub/Sub's emulator allows).
fn push_unencrypted(endpoint: &str) -> bool {
    endpoint.get(..7).is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

/// The project a push configuration set without `--push-project` keeps: the one the
/// subscription's requests name now when that is not the default (a change of endpoint does not
/// rename the subscription for its receiver), else none (the commands every daemon with push
/// knows, which name the default). Asked only when the change pushes.
async fn current_push_project(
    client: &Client,
    name: &str,
    push: &ringpost_client::PushConfig,
) -> Result<Option<String>, Failure> {
    if push.endpoint.is_empty() {
        return Ok(None);
    }
    let current = client.get_subscription_with_push_project(name).await?.push_project;
    Ok((!current.is_empty() && current != ringpost_wire::limits::PUSH_PROJECT_DEFAULT).then_some(current))
}

/// A subscription as a command without the project answers it: a push one names the default.
fn shown_in_default_project(
    subscription: ringpost_client::SubscriptionWithPush,
) -> ringpost_client::SubscriptionWithPushProject {
    let push_project = match subscription.push.endpoint.is_empty() {
        true => String::new(),
        false => ringpost_wire::limits::PUSH_PROJECT_DEFAULT.to_owned(),
    };
    ringpost_client::SubscriptionWithPushProject { subscription, push_project }
}

/// A subscription with its push configuration: the table's `push` cell is `pull`, or the
/// endpoint with what else is set (its project when it is not the default); the JSON's
/// `push_config` is `null` for pull, and names its project.
fn subscription_with_push_row(shown: &ringpost_client::SubscriptionWithPushProject) -> (Vec<String>, String) {
    let (project, shown) = (&shown.push_project, &shown.subscription);
    let (mut cells, _) = subscription_row(&shown.subscription);
    let mut fields = subscription_fields(&shown.subscription);
    let push = &shown.push;
    if push.endpoint.is_empty() {
        cells.push("pull".to_owned());
        fields.push(("push_config", "null".to_owned()));
        return (cells, json::object(&fields));
    }
    let mut cell = push.endpoint.clone();
    if push_unencrypted(&push.endpoint) {
        cell.push_str(&format!(" ({PUSH_NOT_ENCRYPTED})"));
    }
    if push.no_wrapper {
        cell.push_str(if push.write_metadata { ", no wrapper, metadata in headers" } else { ", no wrapper" });
    }
    if !push.service_account_email.is_empty() {
        cell.push_str(&format!(", token for {}", push.service_account_email));
        if !push.audience.is_empty() {
            cell.push_str(&format!(" (audience {})", push.audience));
        }
    }
    if project != ringpost_wire::limits::PUSH_PROJECT_DEFAULT {
        cell.push_str(&format!(", in project {project}"));
    }
    cells.push(cell);
    let attributes: Vec<(&str, String)> = push
        .attributes
        .iter()
        .map(|attribute| (attribute.key.as_str(), json::string(&attribute.value)))
        .collect();
    let push_json = json::object(&[
        ("endpoint", json::string(&push.endpoint)),
        ("encrypted", (!push_unencrypted(&push.endpoint)).to_string()),
        ("no_wrapper", push.no_wrapper.to_string()),
        ("write_metadata", push.write_metadata.to_string()),
        ("service_account_email", json::string(&push.service_account_email)),
        ("audience", json::string(&push.audience)),
        ("attributes", json::object(&attributes)),
        ("project", json::string(project)),
    ]);
    fields.push(("push_config", push_json));
    (cells, json::object(&fields))
}

fn report_invalid(invalid: Vec<ringpost_client::InvalidAckId>) -> Result<(), Failure> {
    if invalid.is_empty() {
        return Ok(());
    }
    for refused in &invalid {
        errln!("InvalidArgument: ack id '{}': {}", refused.ack_id, refused.reason);
    }
    Err(Failure(format!("{} ack id(s) refused", invalid.len()), EXIT_REFUSED))
}

/// Acknowledges what a `pull --stream` printed. A failure does not end the stream: the
/// messages are delivered again (at least once), and the next batch is printed as usual. An
/// ack id of a stream that broke since may be refused the same way.
async fn acknowledge_streamed(client: &Client, subscription: &str, ack_ids: Vec<String>) {
    let count = ack_ids.len();
    match client.acknowledge(subscription, ack_ids).await {
        Ok(refused) => {
            for refused in &refused {
                errln!(
                    "note: ack id '{}' refused ({}): its message will be delivered again",
                    refused.ack_id,
                    refused.reason
                );
            }
        }
        Err(error) => errln!(
            "note: acknowledging {count} message(s) failed ({}): they will be delivered again",
            cli::error_line(&error)
        ),
    }
}

/// The name of a command whose output has no table form, if it prints anything.
fn without_table(command: &Command) -> Option<&'static str> {
    match command {
        Command::Pull(_) => Some("pull prints one JSON object per message"),
        Command::Publish(_) => Some("publish prints one message id per line"),
        Command::Admin(_) => Some("admin prints one JSON object"),
        Command::Probe(_) => Some("probe prints one JSON object per probe"),
        Command::Completions(_) => Some("completions prints a shell script"),
        _ => None,
    }
}

/// `ringpost completions SHELL`: the script, from the commands argh knows.
fn print_completions(shell: &str) -> Result<(), Failure> {
    use argh::SubCommands;
    use ringpost_tools::completions::{Action, CommandTree, Completion};
    let options = |path: &[&str]| cli::usage_options::<Flags>("ringpost", path);
    let actions = |command: &str, infos: &[&'static argh::CommandInfo]| -> Vec<Action> {
        infos
            .iter()
            .map(|info| Action {
                name: info.name,
                description: info.description,
                options: options(&[command, info.name]),
            })
            .collect()
    };
    let commands: Vec<CommandTree> = <Command as SubCommands>::COMMANDS
        .iter()
        .map(|info| {
            let actions = match info.name {
                "topic" => actions(info.name, TopicAction::COMMANDS),
                "sub" => actions(info.name, SubAction::COMMANDS),
                "snapshot" => actions(info.name, SnapshotAction::COMMANDS),
                "schema" => actions(info.name, SchemaAction::COMMANDS),
                "cluster" => actions(info.name, ClusterAction::COMMANDS),
                "admin" => actions(info.name, AdminAction::COMMANDS),
                "token" => actions(info.name, TokenAction::COMMANDS),
                _ => Vec::new(),
            };
            let own = if actions.is_empty() { options(&[info.name]) } else { Vec::new() };
            CommandTree { name: info.name, description: info.description, options: own, actions }
        })
        .collect();
    let options: Vec<(&str, bool)> =
        GLOBAL_OPTIONS.iter().map(|option| (option.name, option.takes_value)).collect();
    let completion = Completion { program: "ringpost", commands: &commands, options: &options };
    let script = completion.script(shell).map_err(|why| Failure::usage(format!("InvalidArgument: {why}")))?;
    outln!("{}", script.trim_end());
    Ok(())
}

/// `--every`'s interval: `10s`, `500ms`, `1m`, or a bare number of seconds.
fn parse_interval(text: &str) -> Result<Duration, Failure> {
    let bad = || Failure::usage(format!("InvalidArgument: --every {text}: give 10s, 500ms, 1m or seconds"));
    let (number, unit_seconds) = if let Some(number) = text.strip_suffix("ms") {
        (number, 0.001)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1.0)
    } else if let Some(number) = text.strip_suffix('m') {
        (number, 60.0)
    } else {
        (text, 1.0)
    };
    let seconds = number.parse::<f64>().map_err(|_| bad())? * unit_seconds;
    if !(0.0..=TIMEOUT_SECONDS_MAX).contains(&seconds) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `ringpost probe`: probes, one JSON line each, until done; exit 1 if any failed or missed.
async fn run_probe(client: &Client, probe: ProbeCommand, every: Option<Duration>) -> Result<(), Failure> {
    use ringpost_tools::probe;
    let objectives = probe::Objectives {
        create_subscription: Duration::from_millis(probe.create_objective_ms),
        publish_ack: Duration::from_millis(probe.publish_objective_ms),
        delivery: Duration::from_millis(probe.delivery_objective_ms),
    };
    let metrics = std::sync::Arc::new(std::sync::Mutex::new(probe::ProbeMetrics::new()));
    if let Some(address) = &probe.http_listen {
        let listener = std::net::TcpListener::bind(address)
            .map_err(|error| Failure::usage(format!("InvalidArgument: --http-listen {address}: {error}")))?;
        let bound = listener.local_addr().map_err(|error| Failure(error.to_string(), EXIT_REFUSED))?;
        errln!("probe: metrics on http://{bound}/metrics");
        probe::serve_metrics(listener, metrics.clone());
    }
    probe::ensure_topic(client, &probe.topic).await?;
    let count = match every {
        None => 1,
        Some(_) => probe.count.unwrap_or(u64::MAX),
    };
    let process = std::process::id();
    let mut failed = 0u64;
    for sequence in 0..count {
        if sequence > 0 {
            ringpost_client::sleep(every.unwrap_or_default()).await;
        }
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_nanos());
        let label = format!("{process}-{sequence}-{nanos}");
        let result = probe::probe(client, &probe.topic, &label, &objectives).await;
        metrics.lock().unwrap().record(&result);
        if !result.ok() {
            failed += 1;
        }
        outln!("{}", result.json(sequence));
    }
    match failed {
        0 => Ok(()),
        failed => Err(Failure(
            format!("probe: {failed} of {count} probes failed or missed an objective"),
            EXIT_REFUSED,
        )),
    }
}

/// `ringpost token create`: a token and its access-file line.
fn create_token(create: &TokenCreate) -> Result<(), Failure> {
    use ringpost_token as token;
    let name = create.name.as_str();
    let special =
        [token::PRINCIPAL_ANONYMOUS, token::PRINCIPAL_ALL_AUTHENTICATED, token::PRINCIPAL_ALL_USERS];
    if special.contains(&name) {
        return Err(Failure::usage(format!(
            "InvalidArgument: {name} is a special principal; a token cannot be given to it"
        )));
    }
    let bad_character = |character: char| character.is_whitespace() || character.is_control();
    if name.is_empty()
        || name.starts_with('#')
        || name.chars().any(bad_character)
        || name.len() > token::PRINCIPAL_BYTES_MAX
    {
        return Err(Failure::usage(format!(
            "InvalidArgument: {name:?} is not a principal name: give 1 to {} bytes, without spaces or control characters, not starting with #",
            token::PRINCIPAL_BYTES_MAX
        )));
    }
    let expires = match &create.expires {
        None => None,
        Some(text) => Some(token::parse_rfc3339_utc(text).ok_or_else(|| {
            Failure::usage(format!(
                "InvalidArgument: --expires {text:?}: give a time in UTC as 2027-01-01T00:00:00Z"
            ))
        })?),
    };
    if expires.is_some_and(|expires| expires <= std::time::SystemTime::now()) {
        errln!("note: --expires is in the past: the daemon will refuse this token");
    }
    let secret = token::generate();
    outln!("{secret}");
    outln!("{}", token::access_line(name, &secret, expires));
    Ok(())
}

async fn run(server: &str, flags: Flags) -> Result<(), Failure> {
    if let Command::Token(TokenCommand { action: TokenAction::Create(create) }) = &flags.command {
        return create_token(create);
    }
    if let Command::Completions(completions) = &flags.command {
        return print_completions(&completions.shell);
    }
    let timeout = request_timeout(flags.timeout)?;
    let output = flags.output;
    if output == Output::Table {
        if let Some(what) = without_table(&flags.command) {
            errln!("note: --output table does not apply here: {what}");
        }
    }
    // Local checks before connecting: a usage error is one whether or not a server answers.
    let publish_messages = match &flags.command {
        Command::Publish(publish) => Some(messages_to_publish(publish)?),
        _ => None,
    };
    let schema_read = match &flags.command {
        Command::Schema(SchemaCommand { action }) => schema_input(action)?,
        _ => SchemaInput::default(),
    };
    let topic_schema = match &flags.command {
        Command::Topic(TopicCommand { action: TopicAction::Create(create) }) => created_topic_schema(create)?,
        Command::Topic(TopicCommand { action: TopicAction::Update(update) }) => updated_topic_schema(update)?,
        _ => None,
    };
    let security = cli::SecurityOptions {
        token: flags.token.clone(),
        ca: flags.ca.clone(),
        cert: flags.cert.clone(),
        key: flags.key.clone(),
        server_name: flags.server_name.clone(),
    }
    .security()
    .map_err(Failure::usage)?;
    let probe_every = match &flags.command {
        Command::Probe(probe) => probe.every.as_deref().map(parse_interval).transpose()?,
        _ => None,
    };
    let client =
        Client::connect_with_security(server, PoolSettings::default(), timeout, security.clone()).await?;
    match flags.command {
        Command::Probe(probe) => run_probe(&client, probe, probe_every).await?,
        Command::Topic(TopicCommand { action }) => match action {
            TopicAction::Create(create) => {
                let topic =
                    Topic { name: create.name, message_retention_seconds: create.retention.unwrap_or(0) };
                let (min, max) = source_bounds(create.sources, create.sources_min, create.sources_max)?;
                let replicas = create.replicas.unwrap_or(0);
                if let Some(settings) = topic_schema {
                    let sources = match create.sources {
                        Some(SourcesFlag::Fixed(sources)) => sources,
                        _ => 0,
                    };
                    let topic = client.create_topic_with_schema(topic, replicas, sources, settings).await?;
                    print_rows(output, &TOPIC_SCHEMA_HEADER, vec![topic_schema_row(&topic)]);
                    return Ok(());
                }
                if let Some(SourcesFlag::Fixed(sources)) = create.sources {
                    let topic = client.create_topic_with_sources(topic, replicas, sources).await?;
                    print_rows(output, &TOPIC_SOURCES_HEADER, vec![topic_sources_row(&topic)]);
                    return Ok(());
                }
                if create.sources == Some(SourcesFlag::Auto) {
                    // Created with its least, then made to follow its load: a daemon that cannot
                    // follow it refuses the second step and the topic stays, its count fixed.
                    let name = topic.name.clone();
                    client.create_topic_with_sources(topic, replicas, min).await?;
                    let topic = client.follow_topic_load(&name, min, max).await?;
                    print_rows(output, &TOPIC_POLICY_HEADER, vec![topic_policy_row(&topic)]);
                    return Ok(());
                }
                let topic = match create.replicas {
                    Some(replicas) => client.create_topic_replicated(topic, replicas).await?,
                    None => client.create_topic_with(topic).await?,
                };
                print_rows(output, &TOPIC_HEADER, vec![topic_row(&topic)]);
            }
            TopicAction::Get(get) => {
                // A topic whose count is fixed is shown as before following the load existed.
                let topic = client.get_topic_source_policy(&get.name).await?;
                let (mut header, mut row) = if topic.auto {
                    (TOPIC_POLICY_HEADER.to_vec(), topic_policy_row(&topic))
                } else {
                    (TOPIC_SOURCES_HEADER.to_vec(), topic_sources_row(&topic.topic))
                };
                // Its schema settings, as `gcloud pubsub topics describe` shows them, when it
                // has a schema; a topic without one is shown as before schemas existed.
                let settings = client.get_topic_with_schema(&get.name).await?.schema;
                if !settings.schema.is_empty() {
                    header.extend(["schema", "encoding"]);
                    row = with_schema_settings(row, &settings);
                }
                print_rows(output, &header, vec![row])
            }
            TopicAction::List(_) => {
                let topics = client.list_topics().await?;
                print_rows(output, &TOPIC_HEADER, topics.iter().map(topic_row).collect());
            }
            TopicAction::Delete(delete) => client.delete_topic(&delete.name).await?,
            TopicAction::Update(update) => {
                if update.retention.is_none() && update.sources.is_none() && topic_schema.is_none() {
                    return Err(Failure(
                        "InvalidArgument: nothing to update: give --retention, --sources, --schema or --no-schema"
                            .into(),
                        2,
                    ));
                }
                if let Some(settings) = topic_schema {
                    let topic = client.update_topic_schema(&update.name, settings).await?;
                    if update.retention.is_none() && update.sources.is_none() {
                        print_rows(output, &TOPIC_SCHEMA_HEADER, vec![topic_schema_row(&topic)]);
                        return Ok(());
                    }
                }
                let (min, max) = source_bounds(update.sources, update.sources_min, update.sources_max)?;
                match update.sources {
                    Some(SourcesFlag::Fixed(sources)) => {
                        let topic = client.update_topic_sources(&update.name, sources).await?;
                        if update.retention.is_none() {
                            print_rows(output, &TOPIC_SOURCES_HEADER, vec![topic_sources_row(&topic)]);
                            return Ok(());
                        }
                    }
                    Some(SourcesFlag::Auto) => {
                        let topic = client.follow_topic_load(&update.name, min, max).await?;
                        if update.retention.is_none() {
                            print_rows(output, &TOPIC_POLICY_HEADER, vec![topic_policy_row(&topic)]);
                            return Ok(());
                        }
                    }
                    None => {}
                }
                let changes = ringpost_client::TopicUpdate { message_retention_seconds: update.retention };
                let topic = client.update_topic(&update.name, changes).await?;
                print_rows(output, &TOPIC_HEADER, vec![topic_row(&topic)]);
            }
        },
        Command::Sub(SubCommand { action }) => match action {
            SubAction::Create(create) => {
                let retry = match (create.min_backoff, create.max_backoff) {
                    (None, None) => (0, 0),
                    (minimum, maximum) => retry_bounds(minimum, maximum)?,
                };
                let push = push_flags!(create).config()?;
                let push_project = create.push_project;
                let subscription = Subscription {
                    name: create.name,
                    topic: create.topic,
                    ack_deadline_seconds: create.ack_deadline,
                    retain_acked_messages: create.retain_acked,
                    message_retention_seconds: create.retention,
                    expiration_ttl_seconds: create.expiration.map_or(0, Expiration::ttl_seconds),
                    enable_message_ordering: create.ordering,
                    filter: create.filter,
                    dead_letter_topic: create.dead_letter_topic,
                    max_delivery_attempts: create.max_delivery_attempts,
                    minimum_backoff_seconds: retry.0,
                    maximum_backoff_seconds: retry.1,
                };
                // Without push flags, the command every daemon version knows.
                match push {
                    None => {
                        let subscription = client.create_subscription(subscription).await?;
                        print_rows(output, &SUBSCRIPTION_HEADER, vec![subscription_row(&subscription)]);
                    }
                    // Without --push-project, the command every daemon with push knows.
                    Some(push) => {
                        let created = match push_project {
                            None => shown_in_default_project(
                                client.create_subscription_with_push(subscription, push).await?,
                            ),
                            Some(project) => {
                                client
                                    .create_subscription_with_push_project(subscription, push, &project)
                                    .await?
                            }
                        };
                        print_rows(
                            output,
                            &SUBSCRIPTION_WITH_PUSH_HEADER,
                            vec![subscription_with_push_row(&created)],
                        );
                    }
                }
            }
            SubAction::Get(get) => {
                let subscription = client.get_subscription_with_push_project(&get.name).await?;
                print_rows(
                    output,
                    &SUBSCRIPTION_WITH_PUSH_HEADER,
                    vec![subscription_with_push_row(&subscription)],
                );
            }
            SubAction::ModifyPushConfig(modify) => {
                let push = push_flags!(modify).config()?.unwrap_or_default();
                let project = match modify.push_project {
                    None => current_push_project(&client, &modify.name, &push).await?,
                    given => given,
                };
                match project {
                    None => client.modify_push_config(&modify.name, push).await?,
                    Some(project) => {
                        client.modify_push_config_with_project(&modify.name, push, &project).await?
                    }
                }
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
            SubAction::Update(update) => {
                let mut changes = update.changes()?;
                if let (Some(push), None) = (&changes.push, &changes.push_project) {
                    changes.push_project = current_push_project(&client, &update.name, push).await?;
                }
                if changes.push.is_none() {
                    let subscription = client.update_subscription(&update.name, changes).await?;
                    print_rows(output, &SUBSCRIPTION_HEADER, vec![subscription_row(&subscription)]);
                } else {
                    let updated = client.update_subscription_with_push_project(&update.name, changes).await?;
                    print_rows(
                        output,
                        &SUBSCRIPTION_WITH_PUSH_HEADER,
                        vec![subscription_with_push_row(&updated)],
                    );
                }
            }
            SubAction::Seek(seek) => match (seek.time, seek.snapshot) {
                (Some(time), None) => {
                    let time_ms = json::parse_time(&time)
                        .map_err(|why| Failure::usage(format!("InvalidArgument: --time '{time}': {why}")))?;
                    client.seek(&seek.name, time_ms).await?;
                }
                (None, Some(snapshot)) => client.seek_to_snapshot(&seek.name, &snapshot).await?,
                _ => {
                    return Err(Failure::usage("InvalidArgument: give exactly one of --time and --snapshot"))
                }
            },
        },
        Command::Publish(publish) => {
            let messages = publish_messages.expect("built above for publish");
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
                let ids = client.publish(&publish.topic, batch).await?;
                for id in ids {
                    outln!("{id}");
                }
            }
        }
        Command::Pull(pull) => {
            if !(0.0..=60.0).contains(&pull.wait) {
                return Err(Failure::usage("InvalidArgument: --wait must be 0 to 60 seconds"));
            }
            if pull.stream {
                let settings = ringpost_client::StreamSettings {
                    max_outstanding_messages: pull.max.max(1) as u64,
                    ..Default::default()
                };
                // A stream that breaks (its forwarder's node died, the daemon restarted) is
                // opened again, for as long as one request may take (--timeout).
                let mut stream =
                    client.resuming_streaming_pull(&pull.subscription, settings, timeout).await?;
                loop {
                    match stream.next().await? {
                        StreamEvent::Messages(batch) => {
                            let ack_ids = print_messages(&batch, pull.base64);
                            if pull.ack && !ack_ids.is_empty() {
                                acknowledge_streamed(&client, &pull.subscription, ack_ids).await;
                            }
                        }
                        StreamEvent::Broken(error) => errln!(
                            "note: the stream of '{}' broke ({}); opening it again for up to {:?}",
                            pull.subscription,
                            cli::error_line(&error),
                            timeout
                        ),
                        StreamEvent::Reopened(after) => errln!(
                            "note: the stream of '{}' is open again, {:.1} s after it broke; messages it \
                             had delivered and that were not acknowledged come again",
                            pull.subscription,
                            after.as_secs_f64()
                        ),
                    }
                }
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
        Command::Stats(_) => {
            let nodes = cluster_stats(&client, timeout, &security).await?;
            print_stats(output, &nodes, &row_sources(&client, &nodes).await);
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::Status(_) }) => {
            let status = client.cluster_status().await?;
            let lags = if status.topics.iter().any(|topic| topic.replica_nodes.len() > 1) {
                replica_lags(&cluster_stats(&client, timeout, &security).await?)
            } else {
                Default::default()
            };
            print_cluster_status(output, &status, &lags);
            // A daemon from before drains refuses the question: it has no draining node.
            if let Ok(drains) = client.drain_status().await {
                print_drains(output, &drains.nodes);
            }
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::AddNode(add) }) => {
            client.add_node(add.node_id, &add.cluster_address, add.voter).await?;
            let role = if add.voter { "voter" } else { "learner" };
            outln!("{}", json::object(&[("node_id", add.node_id.to_string()), ("role", json::string(role))]));
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::Drain(drain) }) => {
            client.drain_node(drain.node_id, true).await?;
            wait_drained(&client, drain.node_id, Duration::from_secs(drain.wait)).await?;
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::Undrain(undrain) }) => {
            client.drain_node(undrain.node_id, false).await?;
            outln!(
                "{}",
                json::object(&[("node_id", undrain.node_id.to_string()), ("draining", "false".to_owned())])
            );
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::RestrictAdd(add) }) => {
            let rule = routing_rule(add.principal, add.from, add.allow, add.deny)?;
            client.restrict_routes(rule, true).await?;
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::RestrictRemove(remove) }) => {
            let rule = routing_rule(remove.principal, remove.from, remove.allow, remove.deny)?;
            client.restrict_routes(rule, false).await?;
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::RestrictList(_) }) => {
            let rules = client.routing_rules().await?.rules;
            let rows = rules
                .iter()
                .map(|rule| {
                    let nodes: Vec<String> = rule.nodes.iter().map(u64::to_string).collect();
                    let effect = if rule.allow { "allow" } else { "deny" };
                    let (who, client_of) = if rule.principal.is_empty() {
                        ("from", &rule.from)
                    } else {
                        ("principal", &rule.principal)
                    };
                    (
                        vec![who.to_owned(), client_of.clone(), effect.to_owned(), nodes.join(",")],
                        json::object(&[
                            (who, json::string(client_of)),
                            ("effect", json::string(effect)),
                            ("nodes", format!("[{}]", nodes.join(","))),
                        ]),
                    )
                })
                .collect();
            print_rows(output, &["clients", "of", "effect", "nodes"], rows);
        }
        Command::Cluster(ClusterCommand { action: ClusterAction::RemoveNode(remove) }) => {
            client.remove_node(remove.node_id).await?;
            outln!(
                "{}",
                json::object(&[("node_id", remove.node_id.to_string()), ("removed", "true".to_owned())])
            );
        }
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
                SnapshotAction::Get(get) => {
                    let snapshot = client.get_snapshot(&get.name).await?;
                    print_rows(output, &header, vec![row(&snapshot)]);
                }
                SnapshotAction::List(_) => {
                    let snapshots = client.list_snapshots().await?;
                    print_rows(output, &header, snapshots.iter().map(row).collect());
                }
                SnapshotAction::Delete(delete) => client.delete_snapshot(&delete.name).await?,
            }
        }
        Command::Schema(SchemaCommand { action }) => run_schema(&client, output, action, schema_read).await?,
        Command::Admin(AdminCommand { action: AdminAction::ResyncDir(resync) }) => {
            let done = client.resync_directory(resync.index).await?;
            outln!(
                "{}",
                json::object(&[
                    ("logs_resynced", done.logs_resynced.to_string()),
                    ("batches_copied", done.batches_copied.to_string()),
                ])
            );
        }
        // Done above, before connecting: it needs no server.
        Command::Token(TokenCommand { action: TokenAction::Create(create) }) => create_token(&create)?,
        Command::Completions(completions) => print_completions(&completions.shell)?,
    }
    Ok(())
}

/// The messages `publish` sends, from its arguments, its standard input or its file, with its
/// attributes and ordering key; refusals are usage errors, found before connecting.
fn messages_to_publish(publish: &PublishCommand) -> Result<Vec<Message>, Failure> {
    let mut attributes = Vec::new();
    for pair in &publish.attr {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(Failure::usage(format!("InvalidArgument: --attr '{pair}' is not key=value")));
        };
        attributes.push((key.to_owned(), value.to_owned()));
    }
    let decode = |text: &[u8], place: &dyn Fn() -> String| -> Result<Vec<u8>, Failure> {
        if !publish.base64 {
            return Ok(text.to_vec());
        }
        let text = std::str::from_utf8(text)
            .map_err(|_| Failure::usage(format!("InvalidArgument: {} is not base64: not ASCII", place())))?;
        json::base64_decode(text)
            .map_err(|why| Failure::usage(format!("InvalidArgument: {} is not base64: {why}", place())))
    };
    let data: Vec<Vec<u8>> = match &publish.file {
        Some(_) if !publish.messages.is_empty() => {
            return Err(Failure::usage(
                "InvalidArgument: --file publishes one message: leave out the message arguments",
            ))
        }
        Some(_) if publish.base64 => {
            return Err(Failure::usage(
                "InvalidArgument: --file publishes a file's bytes as they are: leave out --base64",
            ))
        }
        Some(path) => {
            // At most one byte past a message's limit is read: `--file /dev/zero` (or a file
            // of gigabytes) is refused, not read until memory runs out.
            let limit = MESSAGE_BYTES_MAX as u64 + 1;
            let mut bytes = Vec::new();
            let read = if path == "-" {
                std::io::stdin().lock().take(limit).read_to_end(&mut bytes)
            } else {
                std::fs::File::open(path).and_then(|file| file.take(limit).read_to_end(&mut bytes))
            };
            read.map_err(|error| Failure::usage(format!("InvalidArgument: --file {path}: {error}")))?;
            if bytes.len() > MESSAGE_BYTES_MAX {
                return Err(Failure::usage(format!(
                    "InvalidArgument: --file {path} is over the limit of a message, {MESSAGE_BYTES_MAX} bytes (MESSAGE_BYTES_MAX)"
                )));
            }
            if bytes.is_empty() && attributes.is_empty() {
                return Err(Failure::usage(format!(
                    "InvalidArgument: --file {path} is empty: a message needs data or attributes"
                )));
            }
            vec![bytes]
        }
        None if !publish.messages.is_empty() => publish
            .messages
            .iter()
            .enumerate()
            .map(|(index, text)| decode(text.as_bytes(), &|| format!("message argument {}", index + 1)))
            .collect::<Result<_, _>>()?,
        None => {
            // Each line is read up to the longest a message's line can be (base64 takes four
            // bytes for three), so a line too long is refused as soon as it is seen, without
            // being held whole.
            let line_bytes_max = match publish.base64 {
                false => MESSAGE_BYTES_MAX,
                true => MESSAGE_BYTES_MAX.div_ceil(3) * 4,
            };
            let mut input = std::io::stdin().lock();
            let mut data = Vec::new();
            let mut blank_lines = Vec::new();
            let mut line = Vec::new();
            for index in 0.. {
                let number = index + 1;
                match read_line_bounded(&mut input, line_bytes_max, &mut line) {
                    Ok(LineRead::End) => break,
                    Ok(LineRead::Line) => {}
                    Ok(LineRead::TooLong) => {
                        return Err(Failure::usage(format!(
                            "InvalidArgument: line {number} of standard input is over the limit of a message, \
                             {MESSAGE_BYTES_MAX} bytes (MESSAGE_BYTES_MAX{}); use --file for one large message",
                            if publish.base64 { ", base64-encoded" } else { "" }
                        )))
                    }
                    Err(error) => {
                        return Err(Failure::usage(format!(
                            "InvalidArgument: reading standard input: {error}"
                        )))
                    }
                }
                if line.is_empty() {
                    blank_lines.push(number.to_string());
                    continue;
                }
                data.push(decode(&line, &|| format!("line {number} of standard input"))?);
            }
            if !blank_lines.is_empty() {
                errln!(
                    "note: skipped {} blank line(s) of standard input (line {}): a message needs data",
                    blank_lines.len(),
                    blank_lines.join(", ")
                );
            }
            data
        }
    };
    if data.is_empty() {
        return Err(Failure::usage(
            "InvalidArgument: nothing to publish: give messages, --file, or lines on standard input",
        ));
    }
    let messages: Vec<Message> = data
        .into_iter()
        .map(|data| {
            attributes.iter().fold(
                Message::new(data).ordering_key(publish.ordering_key.clone()),
                |message, (key, value)| message.attribute(key, value),
            )
        })
        .collect();
    // The server's checks, made here: a message it would refuse is a usage error, known
    // before anything is sent (and none of the others is sent either).
    for (index, Message(message)) in messages.iter().enumerate() {
        ringpost_wire::validate::validate_message(
            index,
            &message.data,
            message.attributes.iter().map(|attribute| (attribute.key.as_str(), attribute.value.as_str())),
            &message.ordering_key,
        )
        .map_err(|status| Failure::usage(format!("InvalidArgument: {}", status.message)))?;
    }
    Ok(messages)
}

/// How `read_line_bounded` ended.
#[derive(Debug, PartialEq)]
enum LineRead {
    /// A line is in the buffer, without its `\n` or `\r\n`.
    Line,
    /// The input ended (an empty end after the last line break is no line).
    End,
    /// The line is longer than allowed; what was read of it is dropped.
    TooLong,
}

/// Reads the next line of `input` into `line` (cleared first), holding at most
/// `line_bytes_max` bytes of it (plus a `\r`): a longer line is `TooLong` as soon as its bytes
/// pass the bound, without reading the rest of it. A last line without a line break counts.
fn read_line_bounded(
    input: &mut impl std::io::BufRead,
    line_bytes_max: usize,
    line: &mut Vec<u8>,
) -> std::io::Result<LineRead> {
    line.clear();
    let mut any = false;
    loop {
        let available = input.fill_buf()?;
        if available.is_empty() {
            break;
        }
        any = true;
        let (taken, ended) = match available.iter().position(|&byte| byte == b'\n') {
            Some(end) => (end, true),
            None => (available.len(), false),
        };
        if line.len() + taken > line_bytes_max + 1 {
            return Ok(LineRead::TooLong);
        }
        line.extend_from_slice(&available[..taken]);
        input.consume(taken + usize::from(ended));
        if ended {
            break;
        }
    }
    if !any {
        return Ok(LineRead::End);
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    if line.len() > line_bytes_max {
        return Ok(LineRead::TooLong);
    }
    Ok(LineRead::Line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], line_bytes_max: usize) -> Vec<Result<Vec<u8>, LineRead>> {
        let mut reader = std::io::BufReader::with_capacity(4, input);
        let mut line = Vec::new();
        let mut read = Vec::new();
        loop {
            match read_line_bounded(&mut reader, line_bytes_max, &mut line).unwrap() {
                LineRead::Line => read.push(Ok(line.clone())),
                LineRead::End => return read,
                LineRead::TooLong => {
                    read.push(Err(LineRead::TooLong));
                    return read;
                }
            }
        }
    }

    /// Lines lose their `\n` or `\r\n`, a last line without a break counts and an empty end
    /// does not; a line past the bound is refused once its bytes pass it, whatever follows.
    #[test]
    fn standard_input_is_read_a_bounded_line_at_a_time() {
        let ok = |text: &str| Ok(text.as_bytes().to_vec());
        assert_eq!(lines(b"one\r\ntwo\n\nthree", 5), [ok("one"), ok("two"), ok(""), ok("three")]);
        assert_eq!(lines(b"one\n", 5), [ok("one")]);
        assert!(lines(b"", 5).is_empty());
        assert_eq!(lines(b"fives\r\nsixsix\nnever read", 5), [ok("fives"), Err(LineRead::TooLong)]);
        assert_eq!(lines(b"sixsix", 5), [Err(LineRead::TooLong)]);
        // Refused before the rest of an endless line is read.
        let mut endless = std::io::Read::chain(&b"x"[..], std::io::repeat(b'y'));
        let mut reader = std::io::BufReader::new(&mut endless);
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut reader, 1 << 20, &mut line).unwrap(), LineRead::TooLong);
    }
}
