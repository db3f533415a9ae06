//! The README's shell blocks run as written. The rule, stated in the README too: a ```sh block
//! preceded by the line `<!-- readme-test -->` is run, every block in the order of the README
//! against one fresh daemon (as a reader following it would), each line (with its `\`
//! continuations) through `sh -c` with `ringpost` on the PATH and `RINGPOST_SERVER` pointing
//! at the daemon. Every line must exit 0; a `ringpost pull` line must say what it prints in a
//! comment, `# prints "a", "b"`, and print exactly those messages' data, in that order. A
//! ```sh block that runs `ringpost` without the marker fails the test, so that no such block is
//! left untested; blocks of cargo and benchmark scripts carry no marker.

use ringpost_tests::{binary, Daemon};
use std::process::Command;

/// The line that marks the next ```sh block as one this test runs.
const MARKER: &str = "<!-- readme-test -->";

/// One command of a block: its text (continuations joined) and the README line it starts on.
struct Line {
    text: String,
    number: usize,
}

/// A ```sh block: its commands and whether the marker precedes it.
struct Block {
    marked: bool,
    lines: Vec<Line>,
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
        let mut block = Block { marked: previous == MARKER, lines: Vec::new(), first_line: index + 1 };
        let mut pending: Option<Line> = None;
        for (index, line) in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
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
            block.marked || !runs_ringpost,
            "README.md line {}: a block that runs ringpost needs {MARKER} before it",
            block.first_line
        );
    }
    let marked: Vec<&Block> = blocks.iter().filter(|block| block.marked).collect();
    assert!(marked.len() >= 2, "the quickstart and the subscriptions blocks are marked");

    let daemon = Daemon::start("readme");
    let ringpost = binary("ringpost");
    let directory = ringpost.parent().unwrap();
    let path = format!("{}:{}", directory.display(), std::env::var("PATH").unwrap_or_default());
    for block in marked {
        for line in &block.lines {
            let output = Command::new("sh")
                .arg("-c")
                .arg(&line.text)
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
