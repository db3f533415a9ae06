//! An operator's edges of ringpostd: a start that fails says why at `--log-level error`; a
//! settings file is checked key by key with its file and line in the error, and
//! `--print-config` prints every setting; the ready file's lines end with a newline; systemd
//! hears `READY=1` once the daemon serves and `STOPPING=1` when it stops (`Type=notify`).

use ringpost_tests::{binary, temporary_directory, Daemon, START_TIMEOUT};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// ringpostd run to its end with `arguments`, its ports free and its extra endpoints off.
fn ringpostd(arguments: &[&str]) -> Output {
    Command::new(binary("ringpostd"))
        .args(["--grpc-listen", "off", "--http-listen", "off"])
        .args(arguments)
        .output()
        .expect("running ringpostd")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A daemon that cannot start, at `--log-level error`: exit 1 and one ERROR line saying why.
fn assert_start_fails_at_error(arguments: &[&str], why: &str) -> String {
    let mut all = vec!["--log-level", "error", "--shards", "1"];
    all.extend_from_slice(arguments);
    let output = ringpostd(&all);
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{arguments:?}: {said}");
    let line = said
        .lines()
        .find(|line| line.contains(" ERROR "))
        .unwrap_or_else(|| panic!("no ERROR line: {said:?}"));
    assert!(line.contains("cannot start") && line.contains(why), "{line}");
    line.to_owned()
}

#[test]
fn fatal_start_errors_are_logged_at_error_level() {
    // A data directory another daemon holds.
    let running = Daemon::start("fatal-in-use");
    let held = running.data_dirs[0].display().to_string();
    assert_start_fails_at_error(
        &["--listen", "127.0.0.1:0", "--data-dir", &held],
        "in use by another ringpostd",
    );

    // A port in use, given as --listen: the router's.
    let directory = temporary_directory("fatal-port");
    let data = directory.join("data").display().to_string();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let line = assert_start_fails_at_error(&["--listen", &listen, "--data-dir", &data], "in use");
    assert!(line.contains("the router's port (--listen)") && line.contains(&listen), "{line}");

    // A forwarder shard's port in use is named as following from --listen, the port given.
    let mut named = false;
    for _ in 0..5 {
        let forwarder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let router_port = forwarder.local_addr().unwrap().port() - 1;
        if std::net::TcpListener::bind(("127.0.0.1", router_port)).is_err() {
            continue;
        }
        let listen = format!("127.0.0.1:{router_port}");
        let line = assert_start_fails_at_error(&["--listen", &listen, "--data-dir", &data], "in use");
        assert!(
            line.contains("forwarder shard 0's port") && line.contains(&format!("--listen {listen}")),
            "{line}"
        );
        named = true;
        break;
    }
    assert!(named, "no free port was found below a taken one");

    // An even number of data directories: a usage error, printed whatever the level.
    let output = ringpostd(&["--log-level", "error", "--data-dir", "a", "--data-dir", "b"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("odd number"), "{}", stderr(&output));
    let _ = std::fs::remove_dir_all(&directory);
}

/// A settings file in `directory` holding `text`.
fn settings_file(directory: &Path, name: &str, text: &str) -> PathBuf {
    let path = directory.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_settings_file_is_checked_key_by_key_naming_its_line() {
    let directory = temporary_directory("settings-checked");
    let cases = [
        ("unknown.toml", "shards = 1\nlisen = \"127.0.0.1:0\"\n", 2, "lisen is not a setting"),
        ("type.toml", "shards = \"two\"\n", 1, "shards = \"two\""),
        ("zero.toml", "# a comment\n\nshards = 0\n", 3, "--shards must be at least 1"),
        ("listen.toml", "listen = \"nonsense\"\n", 1, "--listen nonsense"),
        ("command.toml", "shards = 1\nprint-config = true\n", 2, "give --print-config on the command line"),
        ("switch.toml", "no-pin = \"yes\"\n", 1, "give true or false"),
        ("list.toml", "shards = [1, 2]\n", 1, "one value, not a list"),
        ("option.toml", "shards = true\n", 1, "give a value"),
        ("even.toml", "data-dir = [\"a\", \"b\"]\n", 1, "odd number"),
    ];
    for (name, text, line, why) in cases {
        let path = settings_file(&directory, name, text);
        let shown = path.display().to_string();
        // Refused alike by --print-config and by a start.
        for print in [true, false] {
            let mut arguments = vec!["--config", shown.as_str()];
            if print {
                arguments.push("--print-config");
            }
            let output = ringpostd(&arguments);
            let said = stderr(&output);
            assert_eq!(output.status.code(), Some(2), "{name} (print {print}): {said}");
            assert!(said.contains(&format!("--config {shown}, line {line}:")), "{name}: {said}");
            assert!(said.contains(why), "{name}: {said}");
        }
    }
    // The command line's value is checked as the command line's, and wins over the file's.
    let path = settings_file(&directory, "fine.toml", "shards = 3\n");
    let output = ringpostd(&["--config", path.to_str().unwrap(), "--print-config", "--shards", "0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(!stderr(&output).contains("line"), "{}", stderr(&output));
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn print_config_prints_every_setting_and_reads_back_as_itself() {
    let directory = temporary_directory("settings-printed");
    let output = Command::new(binary("ringpostd")).arg("--print-config").output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8(output.stdout).unwrap();
    for line in [
        "listen = \"127.0.0.1:7450\"",
        "topics-max = 20000",
        "connections-per-shard-max = 4096",
        "no-pin = false",
    ] {
        assert!(printed.lines().any(|printed| printed == line), "{line} is not in:\n{printed}");
    }
    assert!(printed.lines().any(|line| line.starts_with("shards = ")), "{printed}");
    assert!(printed.lines().any(|line| line.starts_with("# access-file: not set")), "{printed}");
    let file = settings_file(&directory, "printed.toml", &printed);
    let output =
        Command::new(binary("ringpostd")).arg("--config").arg(&file).arg("--print-config").output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(String::from_utf8(output.stdout).unwrap(), printed);
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn the_ready_file_ends_each_line_with_a_newline() {
    let daemon = Daemon::start_with(
        "ready-newline",
        Vec::new(),
        ["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
            .iter()
            .map(|word| word.to_string())
            .collect(),
    );
    let text = std::fs::read_to_string(daemon.directory.join("ready")).unwrap();
    assert!(text.ends_with('\n'), "{text:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text:?}");
    assert_eq!(lines[0], daemon.address);
    assert!(lines[1].starts_with("grpc ") && lines[2].starts_with("http "), "{text:?}");
    // `read` in a shell takes the first line whole, as scripts read it.
    let read = Command::new("sh")
        .arg("-c")
        .arg(format!("read address < '{}' && echo \"$address\"", daemon.directory.join("ready").display()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&read.stdout).trim_end(), daemon.address);
}

/// What the daemon tells `socket` within `limit`.
fn told(socket: &UnixDatagram, limit: Duration) -> String {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buffer = [0u8; 512];
    let length = socket.recv(&mut buffer).expect("a notification");
    String::from_utf8_lossy(&buffer[..length]).into_owned()
}

/// sd_notify, as systemd runs a `Type=notify` unit: a datagram socket named by $NOTIFY_SOCKET
/// (a path, or an abstract name after `@`) hears READY=1 once the daemon serves (its ready
/// file is written by then) and STOPPING=1 at its SIGTERM; and the unit says `Type=notify`.
#[test]
fn systemd_hears_ready_once_the_daemon_serves_and_stopping_at_sigterm() {
    use std::os::linux::net::SocketAddrExt;
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/systemd/ringpostd.service");
    let unit = std::fs::read_to_string(unit).unwrap();
    assert!(unit.lines().any(|line| line == "Type=notify"), "{unit}");

    let directory = temporary_directory("sd-notify");
    let path = directory.join("notify");
    let by_path = UnixDatagram::bind(&path).unwrap();
    let name = format!("ringpost-test-notify-{}", std::process::id());
    let by_name = UnixDatagram::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap(),
    )
    .unwrap();
    for (socket, variable) in [(&by_path, path.display().to_string()), (&by_name, format!("@{name}"))] {
        let mut daemon = Daemon::prepare("sd-notify", Vec::new(), Vec::new());
        daemon.env.push(("NOTIFY_SOCKET".into(), variable.clone()));
        daemon.launch();
        let started = Instant::now();
        assert_eq!(told(socket, START_TIMEOUT), "READY=1", "{variable}");
        assert!(daemon.poll_ready().unwrap(), "READY=1 came before the daemon served");
        println!("READY=1 {:?} after the launch", started.elapsed());
        daemon.client();
        daemon.signal(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(told(socket, Duration::from_secs(10)), "STOPPING=1", "{variable}");
        assert!(daemon.wait_for_exit(Duration::from_secs(15)).is_some_and(|status| status.success()));
    }
    let _ = std::fs::remove_dir_all(&directory);
}
