//! No function of the daemon outside its tests is over `FUNCTION_LINES_MAX` lines: a long
//! function usually holds several ideas, each easier to read, name and test apart. The test
//! fails listing every one over (`cargo test -p ringpost-tests --test it -- long_functions`).
//!
//! The scan counts braces in the source with comments, strings and character literals taken
//! out, so it needs no parser: a function runs from the line of its `fn` to the line of the
//! brace that closes its body. Items under `#[cfg(test)]` are skipped, and so are the files of
//! modules declared under it (`#[cfg(test)] mod tests;`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The longest a function of the daemon should be, in lines from its `fn` to its closing brace.
const FUNCTION_LINES_MAX: usize = 120;

/// A function found too long: where it starts, its name and its length in lines.
#[derive(Debug, PartialEq, Eq)]
struct LongFunction {
    file: PathBuf,
    line: usize,
    name: String,
    lines: usize,
}

#[test]
fn no_function_of_the_daemon_is_over_120_lines() {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/src");
    let mut long = Vec::new();
    scan_directory(&sources, &mut long);
    long.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| a.file.cmp(&b.file)));
    let listed: Vec<String> = long
        .iter()
        .map(|function| {
            let file = function.file.strip_prefix(&sources).unwrap_or(&function.file);
            format!(
                "{:>5}  daemon/src/{}:{}  {}",
                function.lines,
                file.display(),
                function.line,
                function.name
            )
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions of daemon/src over {FUNCTION_LINES_MAX} lines, tests left out (split them):\n{}",
        listed.join("\n")
    );
}

/// The scan itself, on a source written to show each case it must get right.
#[test]
fn the_scan_counts_bodies_and_skips_tests_strings_and_comments() {
    let long_body = "    let x = 1;\n".repeat(FUNCTION_LINES_MAX);
    let source = format!(
        "fn short() {{ let s = \"}}}}\"; let c = '}}'; // }}\n}}\n\
         fn long<T: Fn() -> u8>(t: T) -> u8 where T: Copy {{\n{long_body}    /* }} */ t()\n}}\n\
         fn declared();\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{long_body}    }}\n}}\n\
         impl S {{ fn method<'a>(&'a self) -> &'a str {{ r#\"}}\"# }} }}\n"
    );
    let mut long = Vec::new();
    let mut test_modules = BTreeSet::new();
    scan_source(Path::new("example.rs"), &source, &mut long, &mut test_modules);
    let found: Vec<(&str, usize)> = long.iter().map(|f| (f.name.as_str(), f.lines)).collect();
    assert_eq!(found, [("long", FUNCTION_LINES_MAX + 3)]);
    assert_eq!(long[0].line, 3);
}

fn scan_directory(directory: &Path, long: &mut Vec<LongFunction>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(directory)
        .unwrap_or_else(|error| panic!("reading {}: {error}", directory.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    // Modules declared under #[cfg(test)] in this directory's files (and in a `mod.rs` for its
    // subdirectory's): their files are tests.
    let mut test_modules = BTreeSet::new();
    let mut found = Vec::new();
    for path in entries.iter().filter(|path| path.extension().is_some_and(|ext| ext == "rs")) {
        let source = std::fs::read_to_string(path).expect("a source file");
        scan_source(path, &source, &mut found, &mut test_modules);
    }
    found.retain(|function: &LongFunction| !is_test_module(&function.file, &test_modules));
    long.extend(found);
    for path in entries.iter().filter(|path| path.is_dir()) {
        if !test_modules.contains(path.file_name().and_then(|name| name.to_str()).unwrap_or("")) {
            scan_directory(path, long);
        }
    }
}

fn is_test_module(file: &Path, test_modules: &BTreeSet<String>) -> bool {
    file.file_stem().and_then(|stem| stem.to_str()).is_some_and(|stem| test_modules.contains(stem))
}

/// The source with comments, strings and character literals blanked out (newlines kept, so
/// that lines still count).
fn code_only(source: &str) -> Vec<u8> {
    let bytes = source.as_bytes();
    let mut code = bytes.to_vec();
    let blank = |code: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut code[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let end = if rest.starts_with(b"//") {
            at + rest.iter().position(|&byte| byte == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            at + 2 + rest[2..].windows(2).position(|pair| pair == b"*/").map_or(rest.len() - 2, |end| end + 2)
        } else if rest.starts_with(b"r#") || rest.starts_with(b"r\"") || rest.starts_with(b"br") {
            let start = if rest[0] == b'b' { 2 } else { 1 };
            let hashes = rest[start..].iter().take_while(|&&byte| byte == b'#').count();
            if rest.get(start + hashes) != Some(&b'"') || (at > 0 && is_identifier(bytes[at - 1])) {
                at += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = start + hashes + 1;
            at + body
                + rest[body..].windows(close.len()).position(|window| window == close).unwrap_or(0)
                + close.len()
        } else if rest[0] == b'"' {
            let mut end = 1;
            while end < rest.len() && rest[end] != b'"' {
                end += if rest[end] == b'\\' { 2 } else { 1 };
            }
            at + end + 1
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{7f}'), not a lifetime ('a).
            match rest.get(1) {
                // The escaped character may be a quote ('\''): the closing one comes after it.
                Some(b'\\') => {
                    at + 3 + rest[3..].iter().position(|&byte| byte == b'\'').map_or(0, |end| end + 1)
                }
                Some(_) if rest.get(2) == Some(&b'\'') => at + 3,
                Some(_) => {
                    // A multi-byte character: its quote within four bytes.
                    match rest[1..].iter().take(5).position(|&byte| byte == b'\'') {
                        Some(end) if !rest[1].is_ascii() => at + 1 + end + 1,
                        _ => at + 1,
                    }
                }
                None => at + 1,
            }
        } else {
            at + 1
        };
        let end = end.min(bytes.len());
        if end > at + 1 {
            blank(&mut code, at, end);
        }
        at = end;
    }
    code
}

fn is_identifier(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Where the brace matching the one at `open` is.
fn matching_brace(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (at, &byte) in code.iter().enumerate().skip(open) {
        match byte {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return at;
                }
            }
            _ => {}
        }
    }
    code.len() - 1
}

/// The first `{` or `;` from `from` outside parentheses, brackets and angle brackets' closures:
/// where an item's body starts, or where a declaration without one ends.
fn body_or_end(code: &[u8], from: usize) -> Option<(usize, u8)> {
    let mut depth = 0i32;
    for (at, &byte) in code.iter().enumerate().skip(from) {
        match byte {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b'{' | b';' if depth == 0 => return Some((at, byte)),
            _ => {}
        }
    }
    None
}

fn scan_source(file: &Path, source: &str, long: &mut Vec<LongFunction>, test_modules: &mut BTreeSet<String>) {
    const CFG_TEST: &[u8] = b"#[cfg(test)]";
    let code = code_only(source);
    let line_of = |at: usize| code[..at].iter().filter(|&&byte| byte == b'\n').count() + 1;
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        if rest.starts_with(CFG_TEST) {
            // Skip the item: a module's body, or a declared module whose file is a test.
            let Some((end, byte)) = body_or_end(&code, at + CFG_TEST.len()) else { break };
            if byte == b';' {
                let item = String::from_utf8_lossy(&code[at + CFG_TEST.len()..end]).trim().to_owned();
                if let Some(name) = item.strip_prefix("mod ").or_else(|| item.strip_prefix("pub mod ")) {
                    test_modules.insert(name.trim().to_owned());
                }
                at = end + 1;
            } else {
                at = matching_brace(&code, end) + 1;
            }
            continue;
        }
        let starts_word = at == 0 || !is_identifier(code[at - 1]);
        if starts_word && rest.starts_with(b"fn ") {
            let name = rest[3..].iter().skip_while(|byte| byte.is_ascii_whitespace());
            let name: String =
                name.take_while(|&&byte| is_identifier(byte)).map(|&byte| byte as char).collect();
            if let Some((open, b'{')) = body_or_end(&code, at + 3) {
                let close = matching_brace(&code, open);
                let lines = line_of(close) - line_of(at) + 1;
                if lines > FUNCTION_LINES_MAX {
                    long.push(LongFunction { file: file.to_path_buf(), line: line_of(at), name, lines });
                }
            }
        }
        // On, inside a function's body too: a nested function is counted as well.
        at += 1;
    }
}
