//! The README's shell blocks run as written. The rule, stated in the README too: a ```sh block
//! preceded by the line `<!-- readme-test -->` is run, every block in the order of the README
//! against one fresh daemon (as a reader following it would), each line (with its `\`
//! continuations) through `sh -c` with `ringpost` on the PATH and `RINGPOST_SERVER` pointing
//! at the daemon (which serves the REST API too: the README's `127.0.0.1:8086` is replaced by
//! its address). Every line must exit 0; a `ringpost pull` line must say what it prints in a
//! comment, `# prints "a", "b"`, and print exactly those messages' data, in that order. A
//! ```sh block that runs `ringpost` without the marker fails the test, so that no such block is
//! left untested; blocks of cargo and benchmark scripts carry no marker.

use ringpost_tests::{binary, Daemon};
use std::process::Command;

/// The line that marks the next ```sh block as one this test runs.
const MARKER: &str = "<!-- readme-test -->";
/// The line that marks the next ```sh block as one of the cluster's: those run together, in
/// order, as one bash script (they start daemons in the background and set variables that
/// later lines use), in an empty folder, with every port they name moved to a free one.
const CLUSTER_MARKER: &str = "<!-- readme-test cluster -->";

/// The REST API's address in the README's curl lines, replaced by the test daemon's.
const README_REST_ADDRESS: &str = "127.0.0.1:8086";

/// One command of a block: its text (continuations joined) and the README line it starts on.
struct Line {
    text: String,
    number: usize,
}

/// A ```sh block: its commands, whether the marker precedes it, and whether it is one of
/// the cluster's (`CLUSTER_MARKER`), with its text as written.
struct Block {
    marked: bool,
    cluster: bool,
    lines: Vec<Line>,
    text: String,
    first_line: usize,
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut previous = "";
    let mut lines = readme.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        if line.trim() != "```sh" {
            if !line.trim().is_empty() {
                previous = line.trim();
            }
            continue;
        }
        let mut block = Block {
            marked: previous == MARKER,
            cluster: previous == CLUSTER_MARKER,
            lines: Vec::new(),
            text: String::new(),
            first_line: index + 1,
        };
        let mut pending: Option<Line> = None;
        for (index, line) in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            block.text.push_str(line);
            block.text.push('\n');
            let (text, continued) = match line.trim_end().strip_suffix('\\') {
                Some(text) => (text, true),
                None => (line.trim_end(), false),
            };
            let command = pending.get_or_insert(Line { text: String::new(), number: index + 1 });
            command.text.push_str(text);
            if !continued {
                let command = pending.take().unwrap();
                if !command.text.trim().is_empty() {
                    block.lines.push(command);
                }
            }
        }
        previous = "```";
        blocks.push(block);
    }
    blocks
}

/// The messages a `# prints "a", "b"` comment names, if the line has one.
fn expected_prints(line: &str) -> Option<Vec<String>> {
    let comment = &line[line.find("# prints")? + "# prints".len()..];
    Some(comment.split('"').skip(1).step_by(2).map(str::to_owned).collect())
}

/// The `data` of each JSON line `pull` printed.
fn pulled_data(output: &str) -> Vec<String> {
    output
        .lines()
        .map(|line| {
            let start = line.find("\"data\":\"").unwrap_or_else(|| panic!("no data in {line}")) + 8;
            let end = start + line[start..].find('"').unwrap();
            line[start..end].to_owned()
        })
        .collect()
}

#[test]
fn readme_blocks_run_as_written() {
    let readme_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(readme_path).expect("reading README.md");
    let blocks = blocks(&readme);
    for block in &blocks {
        let runs_ringpost = block.lines.iter().any(|line| line.text.trim_start().starts_with("ringpost "));
        assert!(
            block.marked || block.cluster || !runs_ringpost,
            "README.md line {}: a block that runs ringpost needs {MARKER} (or {CLUSTER_MARKER}) before it",
            block.first_line
        );
    }
    let marked: Vec<&Block> = blocks.iter().filter(|block| block.marked).collect();
    assert!(marked.len() >= 2, "the quickstart and the subscriptions blocks are marked");

    // The REST API's block names its port as a reader would run it; here it is a free one.
    let flags = ["--grpc-listen", "127.0.0.1:0", "--rest-listen", "127.0.0.1:0"];
    let daemon =
        Daemon::start_with("readme", Vec::new(), flags.iter().map(|flag| (*flag).to_owned()).collect());
    let rest = daemon.rest_address.clone().expect("the REST API's address");
    let ringpost = binary("ringpost");
    let directory = ringpost.parent().unwrap();
    let path = format!("{}:{}", directory.display(), std::env::var("PATH").unwrap_or_default());
    for block in marked {
        for line in &block.lines {
            let output = Command::new("sh")
                .arg("-c")
                .arg(line.text.replace(README_REST_ADDRESS, &rest))
                .env("PATH", &path)
                .env("RINGPOST_SERVER", &daemon.address)
                .output()
                .expect("running sh");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "README.md line {}: `{}` exited with {}:\n{stdout}{}",
                line.number,
                line.text,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            let is_pull = line.text.trim_start().starts_with("ringpost pull ");
            match (is_pull, expected_prints(&line.text)) {
                (true, Some(expected)) => assert_eq!(
                    pulled_data(&stdout),
                    expected,
                    "README.md line {}: `{}` printed:\n{stdout}",
                    line.number,
                    line.text
                ),
                (true, None) => panic!(
                    "README.md line {}: a pull says what it prints in a comment, # prints \"...\"",
                    line.number
                ),
                (false, _) => {}
            }
        }
    }
}

/// Every `127.0.0.1:PORT` of `script` moved by one offset so that each of those ports and the
/// few after each (a router's forwarders) is free here: the README names fixed ports, and other
/// tests run beside this one.
fn move_ports(script: &str) -> String {
    let mut ports = std::collections::BTreeSet::new();
    for (index, _) in script.match_indices("127.0.0.1:") {
        let digits: String =
            script[index + 10..].chars().take_while(|character| character.is_ascii_digit()).collect();
        if let Ok(port) = digits.parse::<u32>() {
            ports.insert(port);
        }
    }
    let (low, high) = (*ports.first().expect("the cluster's blocks name ports"), *ports.last().unwrap());
    let mut random = ringpost_tests::Random::from_time();
    let offset = (0..1000)
        .map(|_| random.between(20_000, 30_000) as u32)
        .find(|base| {
            // Each port named and the three after it (a router's forwarder shards).
            let held: Option<Vec<std::net::TcpListener>> = ports
                .iter()
                .flat_map(|port| (0..4).map(move |next| port + next))
                .map(|port| std::net::TcpListener::bind(("127.0.0.1", (base + port - low) as u16)).ok())
                .collect();
            held.is_some()
        })
        .expect("no free ports for the README's cluster")
        - low;
    assert!(high + offset + 4 < 65_536);
    let mut moved = script.to_owned();
    // Highest first, so that no port is rewritten twice.
    for port in ports.iter().rev() {
        moved = moved.replace(&format!("127.0.0.1:{port}"), &format!("127.0.0.1:{}", port + offset));
    }
    moved
}

/// The cluster's blocks, as one script: three nodes started in the background and waited for
/// as the README says, a node added and removed. Fails if any command fails (`set -e`), and
/// takes down every process it started.
#[test]
fn readme_cluster_blocks_run_as_written() {
    use std::os::unix::process::CommandExt;
    let readme_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(readme_path).expect("reading README.md");
    let script: String =
        blocks(&readme).iter().filter(|block| block.cluster).map(|block| block.text.clone()).collect();
    assert!(script.contains("--node-id 3") && script.contains("--join"), "the cluster's blocks are marked");
    let script = move_ports(&script);
    let directory = ringpost_tests::temporary_directory("readme-cluster");
    let ringpost = binary("ringpost");
    let path =
        format!("{}:{}", ringpost.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!("set -e\n{script}"))
        .current_dir(&directory)
        .env("PATH", &path)
        .env_remove("RINGPOST_SERVER")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Its own process group: the daemons it leaves in the background are stopped with it.
        .process_group(0)
        .spawn()
        .expect("running bash");
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let waited = {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let output = child.wait_with_output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let _ = std::fs::remove_dir_all(&directory);
    let status = waited.expect("the README's cluster blocks did not finish within 180 s");
    assert!(status.success(), "the README's cluster blocks failed ({status}):\n{script}\n{said}");
    assert!(said.contains("leader"), "cluster status shows the leader:\n{said}");
    assert!(said.contains("\"name\":\"orders\""), "the topic was created:\n{said}");
    assert!(said.contains("\"removed\":true"), "node 4 was removed:\n{said}");
}

#[test]
fn the_block_parser_finds_marks_continuations_and_expectations() {
    let readme = "text\n\n<!-- readme-test -->\n```sh\nringpost a \\\n    --b c\nringpost pull s   # prints \"x\", \"y\"\n```\n\n```sh\ncargo test\n```\n";
    let blocks = blocks(readme);
    assert_eq!(blocks.len(), 2);
    assert!(blocks[0].marked && !blocks[1].marked);
    assert_eq!(blocks[0].lines[0].text, "ringpost a     --b c");
    assert_eq!(blocks[0].lines[0].number, 5);
    assert_eq!(expected_prints(&blocks[0].lines[1].text), Some(vec!["x".to_owned(), "y".to_owned()]));
    assert_eq!(expected_prints("ringpost pull s"), None);
}
