//! `ARCHITECTURE.md` against its own rules and the source tree: the file stays short enough to
//! be read whole, each module of the daemon has a short paragraph with the one rule it keeps,
//! and no module directory goes undocumented. The detail lives in `docs/MODULES.md`, which no
//! bound holds.

use std::path::Path;

/// The map, as the daemon is built with it.
const ARCHITECTURE_MARKDOWN: &str = include_str!("../../ARCHITECTURE.md");

/// Words in the whole file: about a quarter of an hour's reading, so a newcomer reads it all.
const ARCHITECTURE_WORDS_MAX: usize = 3_500;

/// Words in one module's paragraph: enough for its purpose, main types, neighbours and its rule;
/// more belongs in `docs/MODULES.md`.
const MODULE_PARAGRAPH_WORDS_MAX: usize = 80;

/// The heading of the section that holds the module paragraphs.
const MODULE_SECTION_HEADING: &str = "## The daemon, module by module";

/// What starts the one line of a module paragraph stating the rule the module keeps.
const INVARIANT_PREFIX: &str = "Invariant:";

/// Words as `wc -w` counts them: runs of characters between whitespace.
fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The module paragraphs of the module section: those starting with a bold lead (`**`).
fn module_paragraphs(markdown: &str) -> Option<Vec<&str>> {
    let start = markdown.find(MODULE_SECTION_HEADING)? + MODULE_SECTION_HEADING.len();
    let section = &markdown[start..];
    let end = section.find("\n## ").unwrap_or(section.len());
    Some(
        section[..end].split("\n\n").map(str::trim).filter(|paragraph| paragraph.starts_with("**")).collect(),
    )
}

/// The bold lead of a paragraph: what it names.
fn lead(paragraph: &str) -> &str {
    paragraph.trim_start_matches("**").split("**").next().unwrap_or("")
}

/// What is wrong with `markdown` as the map of a daemon whose `daemon/src/` has `directories`.
fn problems(markdown: &str, directories: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let total = words(markdown);
    if total > ARCHITECTURE_WORDS_MAX {
        problems.push(format!("ARCHITECTURE.md has {total} words, more than {ARCHITECTURE_WORDS_MAX}"));
    }
    let Some(paragraphs) = module_paragraphs(markdown) else {
        problems.push(format!("ARCHITECTURE.md has no section `{MODULE_SECTION_HEADING}`"));
        return problems;
    };
    for paragraph in &paragraphs {
        let name = lead(paragraph);
        let count = words(paragraph);
        if count > MODULE_PARAGRAPH_WORDS_MAX {
            problems.push(format!("{name}: {count} words, more than {MODULE_PARAGRAPH_WORDS_MAX}"));
        }
        let invariant_lines = paragraph.lines().filter(|line| line.starts_with(INVARIANT_PREFIX)).count();
        let mentions = paragraph.matches(INVARIANT_PREFIX).count();
        if invariant_lines != 1 || mentions != 1 {
            problems.push(format!(
                "{name}: {invariant_lines} lines start with `{INVARIANT_PREFIX}` ({mentions} mentions); one is wanted"
            ));
        }
    }
    for directory in directories {
        let named = format!("`{directory}/");
        if !paragraphs.iter().any(|paragraph| lead(paragraph).contains(&named)) {
            problems.push(format!("daemon/src/{directory}/ has no module paragraph in ARCHITECTURE.md"));
        }
    }
    problems
}

/// The top-level module directories of `daemon/src/`.
fn module_directories() -> Vec<String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut directories: Vec<String> = std::fs::read_dir(&source)
        .expect("reading daemon/src")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_dir())
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    directories.sort();
    directories
}

#[test]
fn the_architecture_is_short_and_names_every_module_with_its_invariant() {
    let directories = module_directories();
    assert!(directories.len() > 10, "daemon/src's module directories were not found: {directories:?}");
    let paragraphs = module_paragraphs(ARCHITECTURE_MARKDOWN).unwrap_or_default();
    assert!(paragraphs.len() >= directories.len(), "only {} module paragraphs", paragraphs.len());
    let problems = problems(ARCHITECTURE_MARKDOWN, &directories);
    assert!(problems.is_empty(), "ARCHITECTURE.md breaks its rules:\n{}", problems.join("\n"));
}

#[test]
fn a_long_paragraph_a_missing_invariant_and_an_unnamed_module_are_found() {
    let directories = vec!["log".to_owned(), "topic".to_owned()];
    let good = format!(
        "# Architecture\n\n{MODULE_SECTION_HEADING}\n\nWhat follows.\n\n**`log/`.** The log.\n\
         Invariant: positions stay ordered.\n\n**`topic/`.** Topics.\nInvariant: one journal.\n\n\
         ## Next\n\n**Not a module.** No rule here.\n"
    );
    assert_eq!(problems(&good, &directories), Vec::<String>::new());
    let long = good.replace("The log.", &"word ".repeat(MODULE_PARAGRAPH_WORDS_MAX));
    assert!(problems(&long, &directories).iter().any(|problem| problem.contains("more than")));
    let without = good.replace("Invariant: one journal.", "One journal.");
    assert!(problems(&without, &directories).iter().any(|problem| problem.starts_with("`topic/`")));
    let twice = good.replace("Invariant: one journal.", "Invariant: one journal.\nInvariant: two.");
    assert!(problems(&twice, &directories).iter().any(|problem| problem.contains("one is wanted")));
    let more = vec!["log".to_owned(), "topic".to_owned(), "shard".to_owned()];
    assert!(problems(&good, &more).iter().any(|problem| problem.contains("daemon/src/shard/")));
    let too_long = format!("{good}{}", "word ".repeat(ARCHITECTURE_WORDS_MAX));
    assert!(problems(&too_long, &directories).iter().any(|problem| problem.contains("words, more than")));
}
