//! What `ringpost` and `ringpost-bench` share as command-line programs: the exit codes, argument
//! parsing that keeps to them, global options accepted anywhere on the line, and writing to a
//! standard output that may be a closed pipe.
//!
//! Exit codes, the same in both programs (and in `ringpostd`):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done (also when standard output was closed early, as by `\| head`) |
//! | 1 | the server refused the request (the message names its code), or the run failed |
//! | 2 | usage: the command line or its input is invalid, found before anything was sent |
//! | 3 | no Ringpost server answered: unreachable, connection lost, deadline passed, or another protocol on that port |

use argh::{EarlyExit, FromArgs};
use std::io::Write;

/// The command did what was asked.
pub const EXIT_OK: u8 = 0;
/// The server refused the request (a status code from the server), or the run failed.
pub const EXIT_REFUSED: u8 = 1;
/// The command line or its input is invalid; nothing was sent for it.
pub const EXIT_USAGE: u8 = 2;
/// No Ringpost server answered: unreachable, connection lost, deadline passed, or not Ringpost.
pub const EXIT_UNREACHABLE: u8 = 3;

/// The exit code for a client error: 1 when the server answered with a status, 3 otherwise.
pub fn exit_code(error: &ringpost_client::Error) -> u8 {
    match error {
        ringpost_client::Error::Status(_) => EXIT_REFUSED,
        _ => EXIT_UNREACHABLE,
    }
}

/// The one line a client error is reported with, starting with its code: `NotFound: topic 'x'`.
/// A refusal for want of a credential or a role also says what to do about it.
pub fn error_line(error: &ringpost_client::Error) -> String {
    use ringpost_client::{Error, ErrorCode};
    match error {
        Error::Status(status) if status.code == ErrorCode::Unauthenticated => {
            format!("{status} ({HINT_UNAUTHENTICATED})")
        }
        Error::Status(status) if status.code == ErrorCode::PermissionDenied => {
            format!("{status} ({HINT_PERMISSION_DENIED})")
        }
        Error::Status(status) => status.to_string(),
        Error::Connect { address, source } => format!("Unavailable: cannot connect to {address}: {source}"),
        Error::Protocol(text) | Error::DeadlineExceeded(text) => format!("{}: {text}", error.code()),
        other => format!("{}: {other}", other.code()),
    }
}

/// What an `Unauthenticated` refusal is followed by.
pub const HINT_UNAUTHENTICATED: &str =
    "give --token or set RINGPOST_TOKEN, or present a client certificate with --cert and --key";
/// What a `PermissionDenied` refusal is followed by.
pub const HINT_PERMISSION_DENIED: &str =
    "the credential is valid but its principal lacks the role; a grant line in the daemon's access file gives it";

/// The security options both programs take, as given on the command line (`None`: not
/// given, so the environment variable of the same name counts).
#[derive(Debug, Default, Clone)]
pub struct SecurityOptions {
    pub token: Option<String>,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub server_name: Option<String>,
}

/// The global options of `SecurityOptions`, for `hoist`.
pub const SECURITY_OPTIONS: [GlobalOption; 5] = [
    GlobalOption { name: "--token", takes_value: true },
    GlobalOption { name: "--ca", takes_value: true },
    GlobalOption { name: "--cert", takes_value: true },
    GlobalOption { name: "--key", takes_value: true },
    GlobalOption { name: "--server-name", takes_value: true },
];

impl SecurityOptions {
    /// The client's `Security`: each option given on the command line, else its environment
    /// variable (`RINGPOST_TOKEN`, `RINGPOST_CA`, `RINGPOST_CERT`, `RINGPOST_KEY`,
    /// `RINGPOST_SERVER_NAME`), else nothing. A file that cannot be read or used is a usage
    /// error, with its name.
    pub fn security(&self) -> Result<ringpost_client::Security, String> {
        self.security_with(|name| std::env::var(name).ok())
    }

    /// `security`, with the environment given (for tests).
    pub fn security_with(
        &self,
        environment: impl Fn(&str) -> Option<String>,
    ) -> Result<ringpost_client::Security, String> {
        use ringpost_client::security::{ENV_CA, ENV_CERT, ENV_KEY, ENV_SERVER_NAME, ENV_TOKEN};
        use std::path::Path;
        let pick = |given: &Option<String>, variable: &str| {
            given.clone().or_else(|| environment(variable)).filter(|value| !value.is_empty())
        };
        let failed = |error: ringpost_client::Error| format!("InvalidArgument: {error}");
        let mut security = ringpost_client::Security::default();
        if let Some(token) = pick(&self.token, ENV_TOKEN) {
            security = security.with_token(token);
        }
        if let Some(ca) = pick(&self.ca, ENV_CA) {
            security = security.with_ca_file(Path::new(&ca)).map_err(failed)?;
        }
        match (pick(&self.cert, ENV_CERT), pick(&self.key, ENV_KEY)) {
            (Some(cert), Some(key)) => {
                if !security.is_tls() {
                    return Err(format!(
                        "InvalidArgument: a client certificate (--cert, --key) needs --ca (or {ENV_CA}), the CA to check the server with"
                    ));
                }
                security = security.with_client_certificate(Path::new(&cert), Path::new(&key)).map_err(failed)?;
            }
            (None, None) => {}
            _ => {
                return Err(format!(
                    "InvalidArgument: --cert and --key (or {ENV_CERT} and {ENV_KEY}) go together: give both or neither"
                ))
            }
        }
        if let Some(name) = pick(&self.server_name, ENV_SERVER_NAME) {
            security = security.with_server_name(name);
        }
        Ok(security)
    }
}

/// A global option that `hoist` takes from anywhere on the command line.
#[derive(Clone, Copy)]
pub struct GlobalOption {
    /// The option's name with its dashes, `--output`.
    pub name: &'static str,
    /// Whether a value follows it.
    pub takes_value: bool,
}

/// Moves the global options in `arguments` (the program name excluded) in front of the rest,
/// wherever they were given, so that `ringpost topic list --output table` means what
/// `ringpost --output table topic list` does. Both `--name value` and `--name=value` are taken;
/// when one is given twice the last one counts. Nothing after a `--` is looked at: it may be a
/// message that reads like an option. A global option without its value is left where it is,
/// for the parser to refuse.
pub fn hoist(arguments: &[String], globals: &[GlobalOption]) -> Vec<String> {
    let mut found: Vec<(&'static str, Option<String>)> = Vec::new();
    let mut rest = Vec::with_capacity(arguments.len());
    let mut index = 0;
    while index < arguments.len() {
        let argument = &arguments[index];
        index += 1;
        if argument == "--" {
            rest.extend(arguments[index - 1..].iter().cloned());
            break;
        }
        let (name, inline) = match argument.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (argument.as_str(), None),
        };
        let Some(global) = globals.iter().find(|global| global.name == name) else {
            rest.push(argument.clone());
            continue;
        };
        let value = match (global.takes_value, inline) {
            (false, _) => None,
            (true, Some(value)) => Some(value),
            (true, None) if index < arguments.len() => {
                index += 1;
                Some(arguments[index - 1].clone())
            }
            (true, None) => {
                rest.push(argument.clone());
                continue;
            }
        };
        found.retain(|(seen, _)| *seen != global.name);
        found.push((global.name, value));
    }
    let mut hoisted = Vec::with_capacity(arguments.len());
    for (name, value) in found {
        hoisted.push(name.to_owned());
        hoisted.extend(value);
    }
    hoisted.extend(rest);
    hoisted
}

/// Parses `arguments` (the program name excluded) with argh, keeping to the exit codes: help
/// goes to standard output with 0, a parse error to standard error with `EXIT_USAGE` (argh's
/// own `from_env` would exit 1, the code of a refusal).
pub fn parse<T: FromArgs>(program: &str, arguments: &[String]) -> Result<T, u8> {
    // `--version` first answers at once, before any subcommand is required.
    if arguments.first().map(String::as_str) == Some("--version") {
        print_out(format_args!("{program} {}\n", env!("CARGO_PKG_VERSION")));
        return Err(EXIT_OK);
    }
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    match T::from_args(&[program], &arguments) {
        Ok(flags) => Ok(flags),
        Err(EarlyExit { output, status: Ok(()) }) => {
            print_out(format_args!("{output}\n"));
            Err(EXIT_OK)
        }
        Err(EarlyExit { output, status: Err(()) }) => {
            eprintln!("{}", output.trim_end());
            if let Some(nearest) = suggestion::<T>(program, &arguments, &output) {
                eprintln!("did you mean `{nearest}`?");
            }
            eprintln!("Run {program} --help for more information.");
            Err(EXIT_USAGE)
        }
    }
}

/// The options of the command at `path` (`["sub", "create"]`), read from its usage line, each
/// with whether a value follows it (`--topic <topic>`); the global options of the program are
/// not among them (they are the program's).
pub fn usage_options<T: FromArgs>(program: &str, path: &[&str]) -> Vec<(String, bool)> {
    let mut asked = path.to_vec();
    asked.push("--help");
    let Err(EarlyExit { output, status: Ok(()) }) = T::from_args(&[program], &asked) else {
        return Vec::new();
    };
    let usage = output.lines().next().unwrap_or_default();
    let words: Vec<&str> = usage.split_whitespace().map(|word| word.trim_start_matches('[')).collect();
    let mut options = Vec::new();
    for (index, word) in words.iter().enumerate() {
        let name = word.trim_end_matches(']');
        if name.starts_with("--") && name.len() > 2 && name != "--help" {
            let valued = words.get(index + 1).is_some_and(|next| next.starts_with('<'));
            if !options.iter().any(|(known, _)| known == name) {
                options.push((name.to_owned(), valued));
            }
        }
    }
    options
}

/// For argh's "Unrecognized argument: X", the known command or option nearest to X at the
/// place it was given (a command among the commands, an option among the options of the
/// command it follows), read from that command's help; `None` when none is near enough
/// (`is_near`) or the error is another.
fn suggestion<T: FromArgs>(program: &str, arguments: &[&str], error: &str) -> Option<String> {
    let unknown = error.lines().find_map(|line| line.strip_prefix("Unrecognized argument: "))?.trim();
    let position = arguments.iter().position(|argument| *argument == unknown)?;
    // The command path before it: each word that, added to the path, has help of its own.
    let mut path: Vec<&str> = Vec::new();
    for word in arguments[..position].iter().filter(|word| !word.starts_with('-')) {
        let mut asked = path.clone();
        asked.extend([*word, "--help"]);
        let usage = format!("Usage: {program} {}", asked[..asked.len() - 1].join(" "));
        if let Err(EarlyExit { output, status: Ok(()) }) = T::from_args(&[program], &asked) {
            if output.starts_with(&format!("{usage} ")) || output.starts_with(&format!("{usage}\n")) {
                path.push(word);
            }
        }
    }
    let mut asked = path.clone();
    asked.push("--help");
    let Err(EarlyExit { output: help, status: Ok(()) }) = T::from_args(&[program], &asked) else {
        return None;
    };
    let (mut options, commands) = known_words(&help);
    if !path.is_empty() {
        // The program's own options (--server, --output, ...) go anywhere on the line.
        if let Err(EarlyExit { output, status: Ok(()) }) = T::from_args(&[program], &["--help"]) {
            options.extend(known_words(&output).0);
        }
    }
    let candidates = if unknown.starts_with('-') { options } else { commands };
    nearest(unknown, &candidates)
}

/// The options (`--name`) and commands a command's help lists.
fn known_words(help: &str) -> (Vec<String>, Vec<String>) {
    let (mut options, mut commands) = (Vec::new(), Vec::new());
    let mut section = "";
    for line in help.lines() {
        if !line.starts_with(' ') {
            section = line.trim_end();
            continue;
        }
        // An entry starts two spaces in; its description's further lines are indented more.
        let Some(entry) = line.strip_prefix("  ").filter(|entry| !entry.starts_with(' ')) else { continue };
        let names = entry.split("  ").next().unwrap_or_default();
        match section {
            "Options:" => options.extend(
                names
                    .split(", ")
                    .map(|name| name.split_whitespace().next().unwrap_or_default())
                    .filter(|name| name.starts_with("--") && *name != "--help")
                    .map(str::to_owned),
            ),
            "Commands:" => commands.extend(names.split_whitespace().next().map(str::to_owned)),
            _ => {}
        }
    }
    (options, commands)
}

/// The candidate nearest to `unknown` by edit distance, if near enough to be a typo of it.
fn nearest(unknown: &str, candidates: &[String]) -> Option<String> {
    candidates
        .iter()
        .map(|candidate| (edit_distance(unknown, candidate), candidate))
        .filter(|(distance, candidate)| is_near(*distance, candidate))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate.clone())
}

/// Whether `distance` edits make a typo of `candidate` rather than another word: one edit in a
/// short name, up to a third of a longer one's letters, never more than three.
fn is_near(distance: usize, candidate: &str) -> bool {
    let letters = candidate.trim_start_matches('-').len();
    distance <= (letters / 3).clamp(1, 3)
}

/// Levenshtein's distance between two words, in characters, with a transposition of two
/// neighbours counting as one edit (the commonest typo).
fn edit_distance(left: &str, right: &str) -> usize {
    let (left, right): (Vec<char>, Vec<char>) = (left.chars().collect(), right.chars().collect());
    let mut rows = vec![vec![0usize; right.len() + 1]; left.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=left.len() {
        for j in 1..=right.len() {
            let substitution = usize::from(left[i - 1] != right[j - 1]);
            let mut best =
                (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + substitution);
            if i > 1 && j > 1 && left[i - 1] == right[j - 2] && left[i - 2] == right[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[left.len()][right.len()]
}

/// The program's name as it was called, for messages.
pub fn program_name() -> String {
    std::env::args()
        .next()
        .and_then(|path| {
            std::path::Path::new(&path).file_name().map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "ringpost".into())
}

/// Writes to standard output. A closed pipe (the reader went away, as `head` does once it has
/// its lines) ends the program at once with 0 and no message: there is no one left to tell.
/// Any other failure to write ends it with `EXIT_REFUSED` and says why on standard error.
/// `println!` would panic instead.
pub fn print_out(text: std::fmt::Arguments<'_>) {
    if let Err(error) = try_print_out(text) {
        exit_on_output_error(error);
    }
}

/// Writes to standard output and flushes it, returning the failure for callers that must clean
/// up before they exit (see `exit_on_output_error`).
pub fn try_print_out(text: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(text)?;
    out.flush()
}

/// Ends the program after standard output failed: quietly with 0 on a closed pipe, otherwise
/// with `EXIT_REFUSED` and the reason.
pub fn exit_on_output_error(error: std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(EXIT_OK.into());
    }
    eprintln_quietly(format_args!("writing standard output: {error}\n"));
    std::process::exit(EXIT_REFUSED.into())
}

/// Writes to standard error, ignoring a failure: a diagnostic that cannot be shown is no reason
/// to stop (`eprintln!` would panic on a closed pipe).
pub fn eprintln_quietly(text: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(text);
}

/// `println!` to standard output through `cli::print_out`: a closed pipe ends the program
/// quietly instead of panicking.
#[macro_export]
macro_rules! outln {
    () => { $crate::cli::print_out(format_args!("\n")) };
    ($($argument:tt)*) => { $crate::cli::print_out(format_args!("{}\n", format_args!($($argument)*))) };
}

/// `eprintln!` that ignores a closed standard error instead of panicking.
#[macro_export]
macro_rules! errln {
    ($($argument:tt)*) => {
        $crate::cli::eprintln_quietly(format_args!("{}\n", format_args!($($argument)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| word.to_string()).collect()
    }

    const GLOBALS: [GlobalOption; 3] = [
        GlobalOption { name: "--server", takes_value: true },
        GlobalOption { name: "--output", takes_value: true },
        GlobalOption { name: "--quiet", takes_value: false },
    ];

    #[test]
    fn global_options_move_to_the_front_from_anywhere() {
        let hoisted = hoist(&strings(&["topic", "list", "--output", "table"]), &GLOBALS);
        assert_eq!(hoisted, strings(&["--output", "table", "topic", "list"]));
        let hoisted =
            hoist(&strings(&["--server", "a:1", "sub", "--output=table", "list", "--quiet"]), &GLOBALS);
        assert_eq!(hoisted, strings(&["--server", "a:1", "--output", "table", "--quiet", "sub", "list"]));
    }

    #[test]
    fn the_last_of_a_repeated_global_option_counts() {
        let hoisted = hoist(&strings(&["--output", "json", "stats", "--output", "table"]), &GLOBALS);
        assert_eq!(hoisted, strings(&["--output", "table", "stats"]));
    }

    #[test]
    fn nothing_after_a_double_dash_is_taken() {
        let hoisted = hoist(&strings(&["publish", "t", "--", "--output", "table"]), &GLOBALS);
        assert_eq!(hoisted, strings(&["publish", "t", "--", "--output", "table"]));
    }

    #[test]
    fn an_option_without_its_value_is_left_for_the_parser() {
        let hoisted = hoist(&strings(&["stats", "--output"]), &GLOBALS);
        assert_eq!(hoisted, strings(&["stats", "--output"]));
    }

    #[test]
    fn options_of_subcommands_are_left_alone() {
        let words = ["sub", "create", "s", "--topic", "t", "--filter", "attributes.x = \"--output\""];
        assert_eq!(hoist(&strings(&words), &GLOBALS), strings(&words));
    }

    #[test]
    fn security_options_win_over_the_environment() {
        let environment = |name: &str| match name {
            "RINGPOST_TOKEN" => Some("from-environment".to_owned()),
            "RINGPOST_CA" => Some(String::new()),
            _ => None,
        };
        let given = SecurityOptions { token: Some("from-flag".into()), ..SecurityOptions::default() };
        let security = given.security_with(environment).unwrap();
        assert_eq!(security.token(), Some("from-flag"));
        assert!(!security.is_tls(), "an empty variable counts as unset");
        let security = SecurityOptions::default().security_with(environment).unwrap();
        assert_eq!(security.token(), Some("from-environment"));
        let missing =
            SecurityOptions { ca: Some("/nonexistent/ca.pem".into()), ..SecurityOptions::default() };
        let error = missing.security_with(|_| None).unwrap_err();
        assert!(error.starts_with("InvalidArgument: ") && error.contains("/nonexistent/ca.pem"), "{error}");
    }

    #[test]
    fn refusals_for_want_of_a_credential_or_a_role_say_what_to_do() {
        use ringpost_client::{Error, ErrorCode, Status};
        let refused = Error::Status(Status::new(ErrorCode::Unauthenticated, "no credential"));
        assert_eq!(error_line(&refused), format!("Unauthenticated: no credential ({HINT_UNAUTHENTICATED})"));
        assert_eq!(exit_code(&refused), EXIT_REFUSED);
        let denied = Error::Status(Status::new(ErrorCode::PermissionDenied, "principal alice lacks it"));
        assert_eq!(
            error_line(&denied),
            format!("PermissionDenied: principal alice lacks it ({HINT_PERMISSION_DENIED})")
        );
    }

    /// A program shaped like ringpost's, for the suggestions: a global option, commands with
    /// actions, options with values and switches.
    #[derive(FromArgs)]
    /// the program
    struct Program {
        /// the server
        #[argh(option)]
        _server: Option<String>,
        #[argh(subcommand)]
        _command: ProgramCommand,
    }

    // Read by argh only: the test looks at what it refuses and suggests.
    #[allow(dead_code)]
    #[derive(FromArgs)]
    #[argh(subcommand)]
    enum ProgramCommand {
        Publish(Publish),
        Sub(Sub),
    }

    #[derive(FromArgs)]
    /// publish
    #[argh(subcommand, name = "publish")]
    struct Publish {
        #[argh(positional)]
        _topic: String,
    }

    #[derive(FromArgs)]
    /// subscriptions
    #[argh(subcommand, name = "sub")]
    struct Sub {
        #[argh(subcommand)]
        _action: SubAction,
    }

    #[allow(dead_code)]
    #[derive(FromArgs)]
    #[argh(subcommand)]
    enum SubAction {
        Create(Create),
        List(List),
    }

    #[derive(FromArgs)]
    /// create
    #[argh(subcommand, name = "create")]
    struct Create {
        #[argh(positional)]
        _name: String,
        /// the ack deadline
        #[argh(option)]
        _ack_deadline: Option<u32>,
        /// keep acknowledged messages
        #[argh(switch)]
        _retain_acked: bool,
    }

    #[derive(FromArgs)]
    /// list
    #[argh(subcommand, name = "list")]
    struct List {}

    fn suggest(arguments: &[&str]) -> Option<String> {
        let Err(EarlyExit { output, status: Err(()) }) = Program::from_args(&["ringpost"], arguments) else {
            panic!("{arguments:?} should not parse");
        };
        suggestion::<Program>("ringpost", arguments, &output)
    }

    /// An unknown command or option gets the nearest known one at its place, a word that is
    /// near nothing gets none, and a value that reads like a command is not taken for one.
    #[test]
    fn typos_get_the_nearest_command_or_option() {
        assert_eq!(suggest(&["publsh", "orders"]).as_deref(), Some("publish"));
        assert_eq!(suggest(&["sub", "crate", "s"]).as_deref(), Some("create"));
        assert_eq!(suggest(&["sub", "lsit"]).as_deref(), Some("list"));
        assert_eq!(suggest(&["sub", "create", "s", "--ack-dedline", "5"]).as_deref(), Some("--ack-deadline"));
        assert_eq!(suggest(&["sub", "create", "sub", "--retain-aked"]).as_deref(), Some("--retain-acked"));
        assert_eq!(suggest(&["sub", "create", "s", "--sever", "a:1"]).as_deref(), Some("--server"));
        assert_eq!(
            suggest(&["--server", "sub", "sub", "lst"]).as_deref(),
            Some("list"),
            "a value, then a command"
        );
        assert_eq!(suggest(&["xyzzy"]), None);
        assert_eq!(suggest(&["sub", "create", "s", "--deadline-of-ack"]), None);
    }

    /// A command's options come from its usage line, each with whether a value follows it;
    /// the program's own are not a command's.
    #[test]
    fn a_commands_options_are_read_from_its_usage() {
        let options = usage_options::<Program>("ringpost", &["sub", "create"]);
        assert_eq!(options, [("--ack-deadline".to_owned(), true), ("--retain-acked".to_owned(), false)]);
        assert!(usage_options::<Program>("ringpost", &["sub", "list"]).is_empty());
        assert_eq!(usage_options::<Program>("ringpost", &[]), [("--server".to_owned(), true)]);
        assert!(usage_options::<Program>("ringpost", &["nothing"]).is_empty());
    }

    #[test]
    fn edit_distance_counts_a_transposition_as_one() {
        assert_eq!(edit_distance("publish", "publish"), 0);
        assert_eq!(edit_distance("publsh", "publish"), 1);
        assert_eq!(edit_distance("lsit", "list"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert!(is_near(1, "get") && !is_near(2, "get"));
        assert!(is_near(3, "--max-delivery-attempts") && !is_near(4, "--max-delivery-attempts"));
    }
}
