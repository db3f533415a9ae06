//! ringpostd's settings file (`--config FILE`) and `--print-config`.
//!
//! The file is TOML whose keys are the flags' names (`data-dir = ["/a", "/b"]`, `no-pin = true`;
//! `_` may stand for `-`). Each key is checked before the daemon starts, with the file and line
//! in the error: a key that is no flag, a value of the wrong type (a switch given a string, an
//! option given `true`, a list where one value goes, a value the flag cannot parse), and later
//! the values themselves (`shards = 0`), which `main` checks as it does the command line's and
//! names through `with_origin`. `--print-config` prints every setting the daemon would start
//! with, defaults included, as a file this reads back.

use crate::Flags;
use ringpost_daemon::Config;
use std::sync::Mutex;

/// Where each flag the settings file set came from (`--config FILE, line N`), for the messages
/// about its value.
static ORIGINS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Keys the file may not hold: they say how to read the settings, not what they are.
const COMMANDS: [&str; 2] = ["config", "print-config"];

/// What a flag is, as argh parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Switch,
    Option,
    Unknown,
}

fn parse(arguments: &[&str]) -> Result<Flags, String> {
    <Flags as argh::FromArgs>::from_args(&["ringpostd"], arguments).map_err(|early| early.output)
}

/// Whether `flag` (`--name`) is a switch, an option that takes a value, or no flag at all.
fn kind_of(flag: &str) -> Kind {
    if flag == "--help" {
        return Kind::Unknown;
    }
    match parse(&[flag]) {
        Ok(_) => Kind::Switch,
        // argh's message for an option given without its value.
        Err(output) if output.starts_with("No value provided") => Kind::Option,
        Err(_) => Kind::Unknown,
    }
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|byte| *byte == b'\n').count() + 1
}

/// A TOML value as a flag's value, or why it cannot be one.
fn scalar(value: &toml::Value) -> Result<String, &'static str> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(number) => Ok(number.to_string()),
        toml::Value::Float(number) => Ok(number.to_string()),
        toml::Value::Boolean(_) => Err("true or false is for a switch; give a value"),
        toml::Value::Array(_) => Err("a list inside a list; give a string or a number"),
        toml::Value::Table(_) | toml::Value::Datetime(_) => Err("give a string or a number"),
    }
}

/// The settings of the TOML file at `path` as flags (`data-dir = ["/a", "/b"]` is
/// `--data-dir /a --data-dir /b`, `no-pin = true` is `--no-pin`), leaving out every key the
/// command line (`given`) sets, so that the command line wins; or the first error, naming the
/// file and its line.
pub fn file_arguments(path: &str, given: &[String]) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("--config {path}: {error}"))?;
    let table: toml::Table = text.parse().map_err(|error| format!("--config {path}: {error}"))?;
    // Parsed again with positions, for the line of each key (the parse above succeeded).
    let spanned = toml::de::DeTable::parse(&text).map_err(|error| format!("--config {path}: {error}"))?;
    // In the file's order, so that the first error is the first line with one.
    let mut keys: Vec<(usize, &str)> = spanned
        .get_ref()
        .iter()
        .map(|(name, _)| (line_of(&text, name.span().start), name.get_ref().as_ref()))
        .collect();
    keys.sort();
    let mut arguments = Vec::new();
    let mut origins = Vec::new();
    for (line, key) in keys {
        let Some(value) = table.get(key) else { continue };
        let at = format!("--config {path}, line {line}");
        let name = key.replace('_', "-");
        let flag = format!("--{name}");
        let refuse = |why: String| -> Result<Vec<String>, String> { Err(format!("{at}: {why}")) };
        if COMMANDS.contains(&name.as_str()) {
            return refuse(format!("{key} is not a setting: give --{name} on the command line"));
        }
        let kind = kind_of(&flag);
        if kind == Kind::Unknown {
            return refuse(format!(
                "{key} is not a setting (the keys are ringpostd's flags without their --; ringpostd --help lists them)"
            ));
        }
        if given.contains(&flag) {
            continue;
        }
        let shown = format!("{key} = {value}");
        let mut these = Vec::new();
        match (kind, value) {
            (Kind::Switch, toml::Value::Boolean(true)) => these.push(flag.clone()),
            (Kind::Switch, toml::Value::Boolean(false)) => {}
            (Kind::Switch, _) => return refuse(format!("{shown}: {key} is a switch; give true or false")),
            (_, toml::Value::Array(items)) => {
                for item in items {
                    let item = scalar(item).map_err(|why| format!("{at}: {shown}: {why}"))?;
                    these.extend([flag.clone(), item]);
                }
            }
            (_, value) => {
                let value = scalar(value).map_err(|why| format!("{at}: {shown}: {why}"))?;
                these.extend([flag.clone(), value]);
            }
        }
        // The flag's own parse: a value of the wrong type (`shards = "two"`), or a list where
        // the flag takes one value, is refused here, at its line.
        let words: Vec<&str> = these.iter().map(String::as_str).collect();
        if let Err(output) = parse(&words) {
            let why = output.trim().rsplit_once("': ").map_or(output.trim(), |(_, why)| why);
            let why = if why.contains("duplicate values") {
                format!("{key} takes one value, not a list")
            } else {
                format!("not a value {key} takes ({why})")
            };
            return refuse(format!("{shown}: {why}"));
        }
        origins.push((flag, at));
        arguments.extend(these);
    }
    *ORIGINS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = origins;
    Ok(arguments)
}

/// `message`, a refusal of the flags, with where the first flag it names came from when that
/// was the settings file (`--config FILE, line N: --shards must be at least 1`).
pub fn with_origin(message: &str) -> String {
    let origins = ORIGINS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let named = flags_named(message)
        .into_iter()
        .find_map(|flag| origins.iter().find(|(known, _)| *known == flag).map(|(_, origin)| origin.clone()));
    match named {
        Some(origin) => format!("{origin}: {message}"),
        None => message.to_owned(),
    }
}

/// The flags (`--name`) `message` names, in order.
fn flags_named(message: &str) -> Vec<String> {
    let mut flags = Vec::new();
    let mut rest = message;
    while let Some(start) = rest.find("--") {
        let after = &rest[start + 2..];
        let length = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(after.len());
        if length > 0 {
            flags.push(format!("--{}", &after[..length]));
        }
        rest = &after[length..];
    }
    flags
}

/// One printed setting's value.
enum Value {
    Text(String),
    Number(String),
    Switch(bool),
    List(Vec<String>),
    /// Not set; the text says what that means.
    Unset(&'static str),
}

fn text(value: impl ToString) -> Value {
    Value::Text(value.to_string())
}

fn number(value: impl ToString) -> Value {
    Value::Number(value.to_string())
}

fn path(value: &Option<std::path::PathBuf>, unset: &'static str) -> Value {
    value.as_ref().map_or(Value::Unset(unset), |path| text(path.display()))
}

/// Every setting the daemon would start with, by flag name: the file's, the command line's and
/// the defaults, as `flags` and the `config` built from them hold them. `log` is the level and
/// format in force.
fn effective(
    flags: &Flags,
    config: &Config,
    log: (&str, &str),
) -> Vec<(&'static str, Value, Option<String>)> {
    let limits = &config.connections;
    let catalog = &config.catalog_limits;
    let auth = match config.access.mode {
        ringpost_daemon::auth::Mode::Off => "off",
        ringpost_daemon::auth::Mode::Required => "required",
    };
    let tls_client_cert = match (&flags.tls_client_cert, &flags.tls_client_ca) {
        (Some(given), _) => text(given),
        (None, Some(_)) => text("optional"),
        (None, None) => Value::Unset("only with --tls-client-ca"),
    };
    let setting = |name, value| (name, value, None);
    vec![
        setting("listen", text(&flags.listen)),
        setting(
            "advertise",
            config
                .advertise
                .as_ref()
                .map_or(Value::Unset("the address each client reached the router at"), text),
        ),
        setting(
            "data-dir",
            Value::List(config.data_dirs.iter().map(|dir| dir.display().to_string()).collect()),
        ),
        setting("shards", number(config.shards)),
        setting("balance-factor", number(config.balance_factor)),
        setting("no-pin", Value::Switch(!config.pin_shards)),
        setting("segment-bytes-max", number(config.log.segment_bytes_max)),
        setting("io-memory-mib", number((config.io_memory_bytes >> 20).max(1))),
        setting("ready-file", path(&flags.ready_file, "no ready file is written")),
        setting("quarantine-damaged", Value::Switch(config.quarantine_damaged)),
        setting("connections-per-shard-max", number(limits.connections_per_shard_max)),
        setting("connections-per-peer-max", number(limits.connections_per_peer_max)),
        setting("connections-unauthenticated-max", number(limits.connections_unauthenticated_max)),
        setting(
            "connections-unauthenticated-per-peer-max",
            number(limits.connections_unauthenticated_per_peer_max),
        ),
        setting("partial-frames-mib-max", number(limits.partial_frame_bytes_max >> 20)),
        setting("unauthenticated-deadline-ms", number(limits.unauthenticated_deadline.as_millis())),
        setting("frame-deadline-base-ms", number(limits.frame_deadline_base.as_millis())),
        setting("frame-bytes-per-second-min", number(limits.frame_bytes_per_second_min)),
        setting("idle-deadline-seconds", number(limits.idle_deadline.as_secs())),
        setting("write-stall-deadline-seconds", number(limits.write_stall_deadline.as_secs())),
        ("auth", text(&flags.auth), Some(format!("{auth} here"))),
        setting("access-file", path(&flags.access_file, "no access file")),
        setting("tls-cert", path(&flags.tls_cert, "no TLS")),
        setting("tls-key", path(&flags.tls_key, "no TLS")),
        setting("tls-client-ca", path(&flags.tls_client_ca, "client certificates are not asked for")),
        setting("tls-client-cert", tls_client_cert),
        setting("grpc-listen", text(&flags.grpc_listen)),
        setting("rest-listen", text(&flags.rest_listen)),
        setting("grpc-threads", number(config.grpc.threads)),
        setting("grpc-idle-deadline-seconds", number(config.grpc.idle_deadline.as_secs())),
        setting("log-level", text(log.0)),
        setting("log-format", text(log.1)),
        setting("http-listen", text(&flags.http_listen)),
        setting("push-token-issuer", text(&config.push_token_issuer)),
        setting("topics-max", number(catalog.topics_max)),
        setting("subscriptions-max", number(catalog.subscriptions_max)),
        setting("subscriptions-per-topic-max", number(catalog.subscriptions_per_topic_max)),
        setting("snapshots-max", number(catalog.snapshots_max)),
        setting("outstanding-messages-shard-max", number(config.outstanding.messages_shard_max)),
        setting("outstanding-mib-shard-max", number(config.outstanding.bytes_shard_max >> 20)),
        setting("outstanding-messages-topic-max", number(config.outstanding.messages_topic_max)),
        setting("outstanding-mib-topic-max", number(config.outstanding.bytes_topic_max >> 20)),
        setting("publish-messages-per-second-topic-max", number(config.publish_rate.messages_per_second)),
        setting("publish-kib-per-second-topic-max", number(config.publish_rate.bytes_per_second >> 10)),
        setting("source-add-messages-per-second", number(config.follow_thresholds.add_messages_per_second)),
        setting("source-add-kib-per-second", number(config.follow_thresholds.add_bytes_per_second >> 10)),
        setting("source-retire-percent", number(config.follow_thresholds.retire_percent)),
        setting("source-hold-seconds", number(config.follow_thresholds.hold.as_secs())),
        setting("cluster", flags.cluster.as_ref().map_or(Value::Unset("a node alone"), text)),
        setting("node-id", number(flags.node_id)),
        setting("join", Value::Switch(flags.join)),
        setting("cluster-secret-file", path(&flags.cluster_secret_file, "no cluster secret")),
        setting("cluster-ca", path(&flags.cluster_ca, "no TLS between nodes")),
        setting("push-ca-file", path(&flags.push_ca_file, "the system's roots")),
    ]
}

/// Every setting the daemon would start with, defaults included, as a TOML file that
/// `--config` reads back (settings without a value as comments).
pub fn print(flags: &Flags, config: &Config, log: (&str, &str)) -> String {
    let quote = |text: &str| toml::Value::String(text.to_owned()).to_string();
    let mut file = String::from(
        "# ringpostd's settings as it would start with them (the command line's, the --config file's\n\
         # and the defaults); ringpostd --config FILE reads this back, and ringpostd --help says\n\
         # what each is.\n",
    );
    for (name, value, note) in effective(flags, config, log) {
        let line = match value {
            Value::Text(text) => format!("{name} = {}", quote(&text)),
            Value::Number(number) => format!("{name} = {number}"),
            Value::Switch(on) => format!("{name} = {on}"),
            Value::List(items) => {
                format!("{name} = [{}]", items.iter().map(|item| quote(item)).collect::<Vec<_>>().join(", "))
            }
            Value::Unset(meaning) => format!("# {name}: not set ({meaning})"),
        };
        file.push_str(&line);
        if let Some(note) = note {
            file.push_str(&format!("  # {note}"));
        }
        file.push('\n');
    }
    file
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option `ringpostd --help` lists, without its `--`.
    fn options_in_help() -> Vec<String> {
        let help = parse(&["--help"]).err().expect("--help ends early");
        // An option's own line is indented by two spaces; its description's lines by more.
        help.lines()
            .filter_map(|line| line.strip_prefix("  --"))
            .map(|rest| {
                rest.split(|c: char| c.is_whitespace() || c == ',').next().unwrap_or_default().to_owned()
            })
            .filter(|name| !name.is_empty() && name != "help")
            .collect()
    }

    #[test]
    fn print_config_prints_every_flag_help_lists() {
        let flags = parse(&[]).unwrap();
        let config = Config::new("127.0.0.1:7450".parse().unwrap(), "data".into());
        let printed = print(&flags, &config, ("info", "text"));
        let options = options_in_help();
        assert!(options.len() > 30, "{options:?}");
        for option in options {
            if COMMANDS.contains(&option.as_str()) || option == "help" {
                continue;
            }
            let set = format!("\n{option} = ");
            let unset = format!("\n# {option}: not set");
            assert!(printed.contains(&set) || printed.contains(&unset), "--print-config leaves out {option}");
        }
    }

    #[test]
    fn flags_are_told_apart_as_switches_options_and_strangers() {
        assert_eq!(kind_of("--no-pin"), Kind::Switch);
        assert_eq!(kind_of("--shards"), Kind::Option);
        assert_eq!(kind_of("--data-dir"), Kind::Option);
        assert_eq!(kind_of("--lisen"), Kind::Unknown);
        assert_eq!(kind_of("--help"), Kind::Unknown);
    }

    #[test]
    fn the_flags_a_message_names_are_found_whole() {
        assert_eq!(flags_named("--shards must be at least 1"), ["--shards"]);
        assert_eq!(
            flags_named("give --tls-cert and --tls-key together, or neither"),
            ["--tls-cert", "--tls-key"]
        );
        assert!(flags_named("no flag -- here").is_empty());
        assert_eq!(line_of("a\nb\nc", 2), 2);
    }
}
