//! `docs/LIMITS.md` against the code: every name in its table is a constant defined in the file
//! its row names, with the value the row gives; and every constant of the daemon named like a
//! bound (`*_MAX`, a deadline, a timeout) is in the table or in `NOT_IN_THE_TABLE` with the
//! reason it is not a bound a reader of that table looks for.
//!
//! Values come from the constants themselves (`REACHABLE`) wherever this module can name them;
//! a constant private to its module, or in another binary, is read from its definition in the
//! source (`READ_FROM_SOURCE`), which takes only literal arithmetic and `Duration`s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The table, as the daemon is built with it.
const LIMITS_MARKDOWN: &str = include_str!("../../docs/LIMITS.md");

/// A bound's value: a count or a size (the table writes sizes in KiB and MiB, and rates per
/// second), or a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    Number(u128),
    Time(Duration),
}

impl From<usize> for Limit {
    fn from(value: usize) -> Limit {
        Limit::Number(value as u128)
    }
}
impl From<u64> for Limit {
    fn from(value: u64) -> Limit {
        Limit::Number(value.into())
    }
}
impl From<u32> for Limit {
    fn from(value: u32) -> Limit {
        Limit::Number(value.into())
    }
}
impl From<Duration> for Limit {
    fn from(value: Duration) -> Limit {
        Limit::Time(value)
    }
}

/// `(name, value)` of each constant given by its path; the name is the path's last segment.
macro_rules! constants {
    ($($path:path),* $(,)?) => {
        vec![$({
            let path = stringify!($path);
            (path.rsplit("::").next().unwrap().trim().to_owned(), Limit::from($path))
        }),*]
    };
}

/// The constants of the table this module can name, with their values.
fn reachable() -> Vec<(String, Limit)> {
    use crate::net::server as native;
    let mut constants = constants![
        crate::control::CONTROL_CHANNEL_CAPACITY,
        crate::shard::dead_letters::DEAD_LETTER_CHANNEL_CAPACITY,
        native::REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX,
        native::CONNECTIONS_PER_SHARD_MAX,
        native::CONNECTIONS_PER_PEER_MAX,
        native::CONNECTIONS_UNAUTHENTICATED_MAX,
        native::CONNECTIONS_UNAUTHENTICATED_PER_PEER_MAX,
        native::CLUSTER_CONNECTIONS_UNAUTHENTICATED_MAX,
        native::CLUSTER_HOSTS_MAX,
        native::FRAME_BODY_BYTES_UNAUTHENTICATED_MAX,
        native::SECURITY_CHECK_INTERVAL,
        crate::auth::AUDIT_LINES_PER_SECOND_MAX,
        crate::log::directories::DISK_FULL_LINE_INTERVAL,
        crate::auth::TOKEN_BYTES_MAX,
        crate::auth::ACCESS_FILE_BYTES_MAX,
        crate::auth::policy::PRINCIPAL_BYTES_MAX,
        crate::auth::policy::PATTERN_BYTES_MAX,
        native::PARTIAL_FRAME_BYTES_SHARD_MAX,
        native::UNAUTHENTICATED_DEADLINE,
        native::FRAME_DEADLINE_BASE,
        native::FRAME_BYTES_PER_SECOND_MIN,
        native::CONNECTION_IDLE_MAX,
        native::WRITE_STALL_DEADLINE,
        native::WRITE_STALL_DEADLINE_STOPPING,
        native::STREAM_FRAMES_QUEUED_MAX,
        native::GATHERED_HELD_BYTES_SHARD_MAX,
        crate::subscription::budget::STREAM_RESERVED_BYTES_SHARD_MAX,
        crate::subscription::budget::PULL_RESPONSE_BYTES_MAX,
        crate::subscription::state::UNACKED_WINDOW_MAX,
        crate::subscription::outstanding::OUTSTANDING_MESSAGES_SHARD_MAX,
        crate::subscription::outstanding::OUTSTANDING_BYTES_SHARD_MAX,
        crate::subscription::outstanding::OUTSTANDING_MESSAGES_TOPIC_MAX,
        crate::subscription::outstanding::OUTSTANDING_BYTES_TOPIC_MAX,
        crate::topic::rate::PUBLISH_HOLD_MAX,
        crate::topic::rate::PUBLISH_HELD_BYTES_SHARD_MAX,
        crate::topic::rate::PUBLISH_BURST,
        crate::topic::rate::PUBLISH_RETRY_DELAY_MIN,
        crate::ids::SOURCES_PER_TOPIC_MAX,
        crate::subscription::state::DEADLINE_ENTRIES_PER_LEASE_MAX,
        crate::subscription::state::DEADLINE_ENTRIES_SLACK,
        crate::subscription::offset_map::RING_SPAN_MAX,
        crate::subscription::filter::FILTER_DEPTH_MAX,
        crate::subscription::dead_letter::DEAD_LETTER_BATCH_MESSAGES_MAX,
        crate::shard::TAIL_CACHE_SHARD_BYTES_MAX,
        crate::log::read_ahead::READ_AHEAD_BYTES,
        crate::log::read_ahead::READ_AHEAD_EXTENTS_MAX,
        crate::log::SPARES_PER_SHARD_MAX,
        crate::log::RECYCLED_PER_SHARD_MAX,
        crate::log::directories::DATA_DIRECTORIES_MAX,
        crate::topic::journal::JOURNAL_SEGMENT_BYTES_MAX,
        crate::catalog::CATALOG_COMPACTION_BYTES_MIN,
        crate::catalog::CATALOG_RECENT_ENTRIES_BYTES_MAX,
        crate::catalog::CATALOG_COMPACTION_SNAPSHOT_FACTOR,
        crate::node::IO_MEMORY_BYTES_DEFAULT,
        crate::catalog::entry::REPLICAS_MAX,
        crate::node::CLUSTER_VOTERS_MAX,
        crate::node::CLUSTER_NODES_MAX,
        crate::node::START_REPORT_INTERVAL,
        crate::catalog::CATALOG_PROPOSE_TIMEOUT,
        crate::catalog::CATALOG_CATCH_UP_WAIT,
        crate::router::UNDECIDED_WATCHED_MAX,
        crate::router::UNDECIDED_WATCH,
        crate::router::RECOVERY_ATTACHES_IN_FLIGHT_MAX,
        crate::router::TOPICS_MAX_DEFAULT,
        crate::router::SUBSCRIPTIONS_MAX_DEFAULT,
        crate::router::SUBSCRIPTIONS_PER_TOPIC_MAX_DEFAULT,
        crate::router::SNAPSHOTS_MAX_DEFAULT,
        crate::net::peer::PEER_IDLE_CONNECTIONS_MAX,
        crate::net::peer::PEER_CONNECT_TIMEOUT,
        crate::net::peer::PEER_REQUEST_TIMEOUT,
        crate::net::relay::RELAYED_PULLS_IN_FLIGHT_MAX,
        crate::net::relay::RELAY_REOPEN_TIMEOUT,
        crate::catalog::peer::PEER_ENTRIES_MAX,
        crate::replication::protocol::CHUNKS_PER_LOG_MAX,
        crate::replication::protocol::HISTORY_EPOCHS_MAX,
        ringpost_wire::limits::FRAME_BODY_BYTES_MAX,
        crate::protocol::grpc::bridge::GRPC_JOBS_QUEUED_SHARD_MAX,
        crate::protocol::grpc::bridge::GRPC_JOBS_RUNNING_SHARD_MAX,
        crate::net::grpc::connections::GRPC_CONNECTIONS_MAX,
        crate::net::grpc::connections::GRPC_CONNECTIONS_PER_PEER_MAX,
        crate::net::grpc::connections::GRPC_IDLE_DEADLINE,
        crate::net::grpc::connections::GRPC_PREFACE_TIMEOUT,
        crate::protocol::grpc::GRPC_KEEPALIVE_INTERVAL,
        crate::protocol::grpc::GRPC_KEEPALIVE_TIMEOUT,
        crate::protocol::grpc::GRPC_STREAMS_PER_CONNECTION_MAX,
        crate::protocol::grpc::GRPC_REQUEST_BYTES_MAX,
        crate::protocol::grpc::GRPC_STOP_GRACE,
        crate::protocol::rest::REST_REQUEST_BYTES_MAX,
        crate::protocol::rest::REST_BODY_READ_TIMEOUT,
        crate::protocol::rest::REST_HEADER_READ_TIMEOUT,
        crate::dispatch::routes::ROUTES_CACHED_MAX,
        crate::protocol::grpc::gateway::GRPC_SCHEMAS_CACHED_MS,
        crate::router::schemas::SCHEMAS_MAX,
        crate::router::schemas::SCHEMA_REVISIONS_MAX,
        crate::router::schemas::SCHEMA_DEFINITION_BYTES_MAX,
        crate::schema::SCHEMA_JSON_DEPTH_MAX,
        crate::dispatch::CARRY_TIMEOUT,
        crate::router::FORWARDED_APPLY_WAIT,
        crate::replication::source::APPEND_BYTES_MAX,
        crate::replication::source::APPEND_REQUEST_BYTES_MAX,
        crate::replication::source::APPENDS_IN_FLIGHT,
        crate::replication::source::APPEND_PIPELINE_RECORDS_MIN,
        crate::replication::source::COMMIT_WAIT_MAX,
        crate::replication::source::SYNC_POINT_WAIT_MAX,
        crate::replication::source::LEADER_LEASE,
        crate::replication::source::LEASE_WAIT,
        crate::net::replica::REPLICA_REQUESTS_IN_FLIGHT_MAX,
        crate::net::replica::REPLICA_BYTES_IN_FLIGHT_MAX,
        crate::net::replica::REPLICA_CONNECT_TIMEOUT,
        crate::net::replica::REPLICA_REQUEST_TIMEOUT,
        crate::shard::replica::PROMOTION_FENCE_WAIT,
        crate::router::SOURCE_FAILURE_TIMEOUT,
        crate::catalog::standing::LEADER_CONTACT_LOST_AFTER,
        crate::catalog::standing::MEMBER_UNREACHABLE_AFTER,
        crate::router::CLUSTER_WATCH_INTERVAL,
        crate::router::ELECTIONS_ASKED_MAX,
        crate::router::MEMBERSHIP_CHANGE_TIMEOUT,
        crate::router::NODE_ID_MAX,
        crate::api::cluster::CLUSTER_STATUS_TOPICS_MAX,
        crate::api::cluster::DRAIN_TOPICS_NAMED_MAX,
        crate::router::drain::DRAIN_PASS_INTERVAL,
        crate::router::SOURCES_PASS_INTERVAL,
        crate::router::follow::SOURCE_FOLLOW_INTERVAL,
        crate::router::follow::SOURCES_AUTO_MIN,
        crate::router::follow::SOURCES_AUTO_MAX,
        crate::router::follow::SOURCE_ADD_MESSAGES_PER_SECOND_DEFAULT,
        crate::router::follow::SOURCE_ADD_BYTES_PER_SECOND_DEFAULT,
        crate::router::follow::SOURCE_RETIRE_PERCENT_DEFAULT,
        crate::router::follow::SOURCE_HOLD_SECONDS_DEFAULT,
        crate::router::follow::SOURCE_HOLD_SECONDS_MAX,
        crate::catalog::routing::ROUTING_RULES_MAX,
        crate::catalog::routing::ROUTING_PRINCIPAL_BYTES_MAX,
        crate::net::http::HTTP_CONNECTIONS_MAX,
        crate::net::http::HTTP_CONNECTIONS_PER_PEER_MAX,
        crate::net::http::HTTP_REQUEST_HEAD_TIMEOUT,
        crate::net::http::SCRAPE_TIMEOUT,
        crate::push::token::TOKENS_CACHED_MAX,
        crate::push::token::SIGNING_KEY_FILE_BYTES_MAX,
        crate::push::keys::PUSH_KEYS_KNOWN_MAX,
        crate::push::keys::PUSH_KEY_FIELD_BYTES_MAX,
        crate::push::keys::PUSH_KEY_ASK_TIMEOUT,
        crate::push::keys::PUSH_KEY_KEPT_AFTER_HEARD,
        crate::push::keys::PUSH_KEY_RETRY_INTERVAL,
        crate::metrics::exposition::METRICS_TOPICS_MAX,
        crate::metrics::exposition::METRICS_SUBSCRIPTIONS_MAX,
        crate::push::window::PUSH_OUTSTANDING_MAX,
        crate::push::window::PUSH_PAUSE_MAX,
        crate::push::task::PUSH_SUBSCRIPTION_BYTES_MAX,
        crate::push::task::PUSH_BODY_BYTES_SHARD_MAX,
        crate::push::task::PUSH_OFFERS_QUEUED_MAX,
        crate::push::client::PUSH_CONNECTIONS_PER_ENDPOINT_MAX,
        crate::push::client::PUSH_REQUESTS_QUEUED_MAX,
        crate::push::client::PUSH_RESPONSE_BYTES_MAX,
        crate::push::client::PUSH_RESPONSE_BODY_TIMEOUT,
        crate::push::client::PUSH_CONNECTION_IDLE_TIMEOUT,
        crate::push::client::PUSH_ENDPOINTS_TRACKED_MAX,
    ];
    // A field's default rather than a constant.
    let staging = crate::log::LogConfig::default().staging_bytes_max;
    constants.push(("LogConfig::staging_bytes_max".to_owned(), Limit::from(staging)));
    constants
}

/// Constants of the table that this module cannot name (private to their module, or in
/// another binary): their values are read from their definitions.
const READ_FROM_SOURCE: &[&str] = &[
    "FOLLOW_SHARDS_READ_MAX",
    "KEEPALIVE_IDLE",
    "SOURCES_REFRESH_INTERVAL",
    "KEEPALIVE_INTERVAL",
    "KEEPALIVE_PROBES",
    "COALESCE_BYTES_MAX",
    "WRITE_RUNS_MAX",
    "REFUSALS_LINGERING_MAX",
    "REFUSAL_DRAIN_BYTES_MAX",
    "REFUSAL_LINGER",
    "RESYNC_ROUNDS_MAX",
    "RESYNC_MISSED_MAX",
    "IO_MEMORY_MIB_MAX",
    "CATALOG_QUEUE_CAPACITY",
    "SNAPSHOT_CHUNK_BYTES_MAX",
    "TOPICS_LISTED_MAX",
    "SOURCE_FLOORS_LISTED_MAX",
    "GRPC_REQUEST_BYTES_ARRIVING_MAX",
    "GRPC_STREAM_RESPONSE_BYTES_MAX",
    "GRPC_STREAM_RESPONSES_QUEUED_MAX",
    "GRPC_PULL_WAIT_MS",
    "GRPC_SOURCES_CACHED_MS",
    "GRPC_PUBLISH_SPREAD_ATTEMPTS_MAX",
    "GRPC_PULL_GATHER_SLICE_MS",
    "HANDSHAKEN_QUEUED_MAX",
    "REMOVAL_CHECK_INTERVAL",
    "NODE_STATS_WAIT",
    "DRAIN_POLL_INTERVAL",
    "ELECTION_FENCE_WAIT",
    "ELECTIONS_IN_FLIGHT_MAX",
    "REPLICA_ATTACH_WAIT",
    "REPLICAS_DEFAULT_MAX",
    "MOVE_STEP_TIMEOUT",
    "MOVES_IN_FLIGHT_MAX",
    "NODE_CATCH_UP_TIMEOUT",
];

/// Constants named like bounds that the table leaves out, and why.
const NOT_IN_THE_TABLE: &[(&str, &str)] = &[
    ("NANOS_MAX", "the range of a protobuf Timestamp's nanos"),
    ("TOTAL_MAX", "the counter values a rate window stores in its packed word, past any real count"),
    (
        "JOIN_FRAME_BYTES_MAX",
        "which frames a peer's writer copies into one write; a choice of copies, bounding nothing",
    ),
    (
        "ACK_ID_ENCODED_BYTES_MAX",
        "the length of the ack ids the daemon writes; ACK_ID_BYTES_MAX bounds those it reads",
    ),
    ("TIMESTAMP_SECONDS_MAX", "the range of a protobuf Timestamp"),
    ("DER_LENGTH_BYTES_MAX", "the size of a DER length field"),
    ("PROPERTIES_BYTES_MAX", "room an encoding keeps for a field"),
    ("RUNS_PREALLOCATED_MAX", "what a decoder reserves ahead of reading; the entry bounds the rest"),
    ("LATENCY_US_MAX", "the largest latency a histogram records as itself"),
    ("NAME_SHOWN_CHARS_MAX", "how much of a name an error message shows"),
    ("EDITS_MAX", "edits a fuzz input makes to a sample message; not in the daemon built to run"),
    ("REMOVAL_TOPICS_NAMED_MAX", "how many topics an error message names"),
    ("PROBE_SEARCH_DEPTH_MAX", "how deep a probe of a full disk looks for a file"),
    ("PUBLISH_ATTEMPTS_MAX", "forwarders one gRPC publish tries before the client's retry"),
    ("ACCEPT_BACKOFF_MAX", "the longest pause between failing accepts"),
    ("RETRY_PAUSE_MAX", "the longest pause before a leader tries a follower again"),
    ("RELAY_REOPEN_DELAY_MAX", "the longest pause between attempts to reopen a carried stream"),
    ("KIND_DEADLINE_EXTENDED", "a journal record's kind"),
    ("DEADLINE_SLEEP_MIN", "the shortest sleep of a loop waiting for a deadline"),
    ("POLLS_MAX", "the deterministic runtime's livelock guard, in tests"),
    ("VIRTUAL_TIME_MAX", "the deterministic runtime's livelock guard, in tests"),
    ("DRAWN_FAULT_PPM_MAX", "the simulated disk's fault plans, in tests"),
    ("DRAWN_READ_FAULT_PPM_MAX", "the simulated disk's fault plans, in tests"),
    ("DRAWN_LATENCY_MAX", "the simulated disk's fault plans, in tests"),
];

/// One row of the table: its names, their values as written, and the file it names.
#[derive(Debug)]
struct Row {
    names: Vec<String>,
    values: Vec<String>,
    file: PathBuf,
    line: usize,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the daemon crate is in the workspace").to_owned()
}

/// The backticked words of a cell, in order.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (index, line) in LIMITS_MARKDOWN.lines().enumerate() {
        if !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert!(cells.len() == 4, "LIMITS.md line {}: a row has four cells: {line}", index + 1);
        let names = backticked(cells[0]);
        // Values are separated by a comma and a space; thousands only by a comma.
        let values: Vec<String> = cells[1].split(", ").map(str::to_owned).collect();
        let place = backticked(cells[2]);
        assert!(place.len() == 1, "LIMITS.md line {}: Where names one file: {line}", index + 1);
        // A path is in the daemon's sources unless it names another crate.
        let crates = ["wire/", "model/", "token/", "client/", "tools/", "proto/"];
        let file = if crates.iter().any(|name| place[0].starts_with(name)) {
            workspace().join(&place[0])
        } else {
            workspace().join("daemon/src").join(&place[0])
        };
        assert!(
            names.len() == values.len(),
            "LIMITS.md line {}: {} names and {} values: {line}",
            index + 1,
            names.len(),
            values.len()
        );
        rows.push(Row { names, values, file, line: index + 1 });
    }
    assert!(rows.len() > 50, "LIMITS.md's table was not found ({} rows)", rows.len());
    rows
}

/// A value as the table writes it: `4096`, `20,000`, `16 KiB`, `64 MiB`, `1 MiB/s`, `500 ms`,
/// `1.25 s`.
fn parse_value(text: &str) -> Option<Limit> {
    let text = text.replace(',', "");
    let (number, unit) = text.split_once(' ').unwrap_or((&text, ""));
    let time = |scale_ns: f64| -> Option<Limit> {
        let value: f64 = number.parse().ok()?;
        Some(Limit::Time(Duration::from_nanos((value * scale_ns).round() as u64)))
    };
    let whole = || number.parse::<u128>().ok();
    match unit {
        "" => whole().map(Limit::Number),
        "KiB" => whole().map(|value| Limit::Number(value << 10)),
        "MiB" | "MiB/s" => whole().map(|value| Limit::Number(value << 20)),
        "GiB" => whole().map(|value| Limit::Number(value << 30)),
        "s" => time(1e9),
        "ms" => time(1e6),
        "µs" => time(1e3),
        _ => None,
    }
}

/// The source of `file` without what only tests compile: items under `#[cfg(test)]` (whole
/// modules included) are left out, by counting braces.
pub(crate) fn without_tests(source: &str) -> String {
    let mut kept = String::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            kept.push_str(line);
            kept.push('\n');
            continue;
        }
        // Skip the item that follows: up to a `;` before any brace, or to its braces' close.
        let mut depth = 0i64;
        let mut opened = false;
        for line in lines.by_ref() {
            let code = line.split("//").next().unwrap_or("");
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            opened |= code.contains('{');
            if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    kept
}

/// Whether `source` defines a constant `name`.
fn defines(source: &str, name: &str) -> bool {
    source.lines().any(|line| {
        let line = line.trim_start();
        let line = ["pub ", "pub(crate) ", "pub(super) "]
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix))
            .unwrap_or(line);
        line.strip_prefix("const ")
            .and_then(|rest| rest.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with(':'))
    })
}

/// The value of the constant `name` defined in `source`, evaluated from its expression: integer
/// literals, `<<`, `*`, `/`, `+`, parentheses, `Duration::from_secs`/`from_millis`/`from_micros`
/// and other constants of the same file.
fn evaluate(source: &str, name: &str, depth: usize) -> Result<Limit, String> {
    assert!(depth < 8, "{name}: constants defined by each other");
    let start =
        source.find(&format!("const {name}:")).ok_or_else(|| format!("{name} is not defined there"))?;
    let definition = &source[start..];
    let definition = &definition[..definition.find(';').ok_or("a definition without its `;`")?];
    let expression = definition.split_once('=').ok_or("a definition without `=`")?.1;
    let tokens = tokenize(expression);
    let mut parser = Parser { tokens: &tokens, at: 0, source, depth };
    let value = parser.shift()?;
    if parser.at != tokens.len() {
        return Err(format!("{name}: cannot read `{}`", expression.trim()));
    }
    Ok(value)
}

fn tokenize(expression: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut characters = expression.chars().peekable();
    while let Some(&character) = characters.peek() {
        if character.is_whitespace() {
            characters.next();
        } else if character.is_alphanumeric() || character == '_' || character == ':' {
            let mut word = String::new();
            while let Some(&next) = characters.peek() {
                if !(next.is_alphanumeric() || next == '_' || next == ':') {
                    break;
                }
                word.push(next);
                characters.next();
            }
            tokens.push(word);
        } else if character == '<' {
            characters.next();
            characters.next();
            tokens.push("<<".to_owned());
        } else {
            tokens.push(character.to_string());
            characters.next();
        }
    }
    tokens
}

struct Parser<'a> {
    tokens: &'a [String],
    at: usize,
    source: &'a str,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn number(value: Limit) -> Result<u128, String> {
        match value {
            Limit::Number(number) => Ok(number),
            Limit::Time(_) => Err("arithmetic on a Duration".to_owned()),
        }
    }

    fn shift(&mut self) -> Result<Limit, String> {
        let mut value = self.sum()?;
        while self.peek() == Some("<<") {
            self.at += 1;
            let by = Self::number(self.sum()?)?;
            value = Limit::Number(Self::number(value)? << by);
        }
        Ok(value)
    }

    fn sum(&mut self) -> Result<Limit, String> {
        let mut value = self.product()?;
        while self.peek() == Some("+") {
            self.at += 1;
            value = Limit::Number(Self::number(value)? + Self::number(self.product()?)?);
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<Limit, String> {
        let mut value = self.atom()?;
        while let Some(operator @ ("*" | "/")) = self.peek() {
            let multiply = operator == "*";
            self.at += 1;
            let (left, right) = (Self::number(value)?, Self::number(self.atom()?)?);
            value = Limit::Number(if multiply { left * right } else { left / right });
        }
        Ok(value)
    }

    fn atom(&mut self) -> Result<Limit, String> {
        let token = self.peek().ok_or("an expression ends early")?.to_owned();
        self.at += 1;
        if token == "(" {
            let value = self.shift()?;
            return match self.peek() {
                Some(")") => {
                    self.at += 1;
                    Ok(value)
                }
                _ => Err("an unclosed parenthesis".to_owned()),
            };
        }
        if token.starts_with(|character: char| character.is_ascii_digit()) {
            let digits: String = token.chars().take_while(|c| c.is_ascii_digit() || *c == '_').collect();
            let digits = digits.replace('_', "");
            return digits.parse().map(Limit::Number).map_err(|_| format!("`{token}` is not a number"));
        }
        let function = token.strip_prefix("std::time::").unwrap_or(&token);
        let scale_ns = match function {
            "Duration::from_secs" => Some(1_000_000_000),
            "Duration::from_millis" => Some(1_000_000),
            "Duration::from_micros" => Some(1_000),
            _ => None,
        };
        if let Some(scale_ns) = scale_ns {
            let argument = self.atom()?;
            let nanos = Self::number(argument)? * scale_ns;
            return Ok(Limit::Time(Duration::from_nanos(nanos as u64)));
        }
        if token.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
            return evaluate(self.source, &token, self.depth + 1);
        }
        Err(format!("cannot read `{token}`"))
    }
}

/// Every name of the table is a constant of the file its row names, with the row's value.
#[test]
fn every_limit_in_the_table_is_the_constant_it_names() {
    let reachable: BTreeMap<String, Limit> = reachable().into_iter().collect();
    let mut named = BTreeSet::new();
    let mut failures = Vec::new();
    for row in rows() {
        named.extend(row.names.iter().cloned());
        let source = match std::fs::read_to_string(&row.file) {
            Ok(source) => without_tests(&source),
            Err(error) => {
                let place = row.file.strip_prefix(workspace()).unwrap_or(&row.file).display();
                failures.push(format!("LIMITS.md line {}: {place}: {error}", row.line));
                continue;
            }
        };
        for (name, written) in row.names.iter().zip(&row.values) {
            let at = format!("LIMITS.md line {}: `{name}`", row.line);
            let Some(documented) = parse_value(written) else {
                failures.push(format!("{at}: `{written}` is not a value this test reads"));
                continue;
            };
            let (constant, field) = match name.split_once("::") {
                Some((_, field)) => (None, Some(field)),
                None => (Some(name.as_str()), None),
            };
            let place = row.file.strip_prefix(workspace()).unwrap_or(&row.file).display();
            match (constant, field) {
                (Some(constant), _) if !defines(&source, constant) => {
                    failures.push(format!("{at} is not defined in {place}"));
                    continue;
                }
                (_, Some(field)) if !source.contains(&format!("pub {field}:")) => {
                    failures.push(format!("{at}: {place} has no field {field}"));
                    continue;
                }
                _ => {}
            }
            let actual = match reachable.get(name) {
                Some(value) => Ok(*value),
                None if READ_FROM_SOURCE.contains(&name.as_str()) => evaluate(&source, name, 0),
                None => Err("neither in this test's table of constants nor in READ_FROM_SOURCE".to_owned()),
            };
            match actual {
                Ok(actual) if actual == documented => {}
                Ok(actual) => failures.push(format!("{at} is written {written} but is {actual:?}")),
                Err(why) => failures.push(format!("{at}: {why}")),
            }
        }
    }
    for name in reachable.keys().map(String::as_str).chain(READ_FROM_SOURCE.iter().copied()) {
        if !named.contains(name) {
            failures.push(format!("`{name}` is in this test's tables but not in LIMITS.md"));
        }
    }
    assert!(failures.is_empty(), "docs/LIMITS.md disagrees with the code:\n{}", failures.join("\n"));
}

/// Whether a constant's name says it bounds something: `*_MAX` (`*_MAX_DEFAULT` too), a deadline
/// or a timeout.
fn named_like_a_bound(name: &str) -> bool {
    name.ends_with("_MAX") || name.contains("_MAX_") || name.contains("DEADLINE") || name.contains("TIMEOUT")
}

/// The daemon's source files, tests left out (files of tests whole, modules by `without_tests`).
fn daemon_sources(directory: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(directory).expect("reading daemon/src") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            daemon_sources(&path, files);
        } else if name.ends_with(".rs") && !name.ends_with("tests.rs") && name != "sim_checker.rs" {
            files.push(path);
        }
    }
}

/// Every bound the daemon names (outside its tests) is in the table, or said why not.
#[test]
fn every_bound_of_the_daemon_is_in_the_table() {
    let documented: BTreeSet<String> = rows().into_iter().flat_map(|row| row.names).collect();
    let mut files = Vec::new();
    daemon_sources(&workspace().join("daemon/src"), &mut files);
    files.sort();
    let mut missing = Vec::new();
    let mut seen = BTreeSet::new();
    for file in files {
        let source = without_tests(&std::fs::read_to_string(&file).expect("reading a source file"));
        for line in source.lines() {
            let line = line.trim_start();
            let line = ["pub ", "pub(crate) ", "pub(super) "]
                .iter()
                .find_map(|prefix| line.strip_prefix(prefix))
                .unwrap_or(line);
            let Some(rest) = line.strip_prefix("const ") else { continue };
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !named_like_a_bound(&name) {
                continue;
            }
            seen.insert(name.clone());
            if !documented.contains(&name) && !NOT_IN_THE_TABLE.iter().any(|(left_out, _)| *left_out == name)
            {
                let place = file.strip_prefix(workspace()).unwrap_or(&file).display().to_string();
                missing.push(format!("{name} ({place})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "bounds missing from docs/LIMITS.md (add a row, or say in NOT_IN_THE_TABLE why not):\n{}",
        missing.join("\n")
    );
    let stale: Vec<&str> =
        NOT_IN_THE_TABLE.iter().map(|(name, _)| *name).filter(|name| !seen.contains(*name)).collect();
    assert!(stale.is_empty(), "NOT_IN_THE_TABLE names constants the daemon no longer has: {stale:?}");
}

#[test]
fn values_and_definitions_are_read_as_written() {
    assert_eq!(parse_value("20,000"), Some(Limit::Number(20_000)));
    assert_eq!(parse_value("16 KiB"), Some(Limit::Number(16 << 10)));
    assert_eq!(parse_value("1 MiB/s"), Some(Limit::Number(1 << 20)));
    assert_eq!(parse_value("1.25 s"), Some(Limit::Time(Duration::from_millis(1250))));
    assert_eq!(parse_value("500 ms"), Some(Limit::Time(Duration::from_millis(500))));
    assert_eq!(parse_value("a few"), None);
    let source = "const A: usize = 64 << 20;\npub const B: usize = A / 16;\n\
                  pub(crate) const C: Duration = std::time::Duration::from_secs(24 * 3600);\n\
                  const D: u64 = (1 + 2) * 1_000;\n#[cfg(test)]\nmod tests {\n    const E_MAX: u8 = 1;\n}\n";
    assert_eq!(evaluate(source, "B", 0), Ok(Limit::Number(4 << 20)));
    assert_eq!(evaluate(source, "C", 0), Ok(Limit::Time(Duration::from_secs(86_400))));
    assert_eq!(evaluate(source, "D", 0), Ok(Limit::Number(3000)));
    assert!(defines(source, "C") && !defines(source, "CC"));
    assert!(!without_tests(source).contains("E_MAX"));
}
