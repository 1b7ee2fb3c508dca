//! Architecture invariants checked on the source text (ARCHITECTURE.md):
//! - the core (everything in `src/` except `src/web/` and `src/bin/`) does no
//!   I/O, reads no clock or environment, never prints and knows nothing of
//!   the browser;
//! - only `src/trace/` reads the profiler's JSON: no `serde_json::Value` and
//!   no `traceEvents` elsewhere in the core or the page;
//! - core messages speak the user's terms: no command-line flag (`--name`)
//!   in a core string, the shells add their own;
//! - no file in `src/` is over [`MAX_LINES`] lines without a reason at its
//!   top (a `//! Long file:` line).
//!
//! Test modules (from `#[cfg(test)]` to the end of a file) are not checked
//! for the first three.

use std::path::{Path, PathBuf};

const FORBIDDEN: &[(&str, &str)] = &[
    ("std::fs", "file access"),
    ("std::env", "the environment"),
    ("std::net", "networking"),
    ("std::thread", "threads"),
    ("std::process", "processes"),
    ("Instant::now", "the clock"),
    ("SystemTime", "the clock"),
    ("println!", "printing"),
    ("eprintln!", "printing"),
    ("print!(", "printing"),
    ("dbg!(", "printing"),
    ("web_sys", "the browser"),
    ("js_sys", "the browser"),
    ("leptos", "the browser"),
    (
        "#[should_panic]",
        "a banned test style (assert on the error instead)",
    ),
    (
        "#[ignore]",
        "a banned test style (assert the current behaviour instead)",
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|err| panic!("cannot list {dir:?}: {err}"));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn core_modules_do_no_io_and_know_no_browser() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let core: Vec<&PathBuf> = files
        .iter()
        .filter(|path| !path.starts_with(src.join("web")) && !path.starts_with(src.join("bin")))
        .collect();
    assert!(
        core.len() >= 6,
        "expected the core stage modules under {src:?}"
    );
    let mut found = Vec::new();
    for path in core {
        let text = std::fs::read_to_string(path).unwrap();
        // `lib.rs` declares the web module behind its feature gate; that is the one
        // place the core may name it.
        let is_lib = path.ends_with("lib.rs");
        for (line_idx, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (needle, what) in FORBIDDEN {
                if code.contains(needle) && !(is_lib && *needle == "leptos") {
                    found.push(format!(
                        "{}:{}: {what} ({needle})",
                        path.display(),
                        line_idx + 1
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "core code breaks an invariant:\n{}",
        found.join("\n")
    );
}

/// The longest a file in `src/` may be without a reason at its top.
const MAX_LINES: usize = 800;

/// Every `.rs` file under `src/`, sorted.
fn src_files() -> (PathBuf, Vec<PathBuf>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    (src, files)
}

/// The lines of a file before its test module, numbered from 1 (none in a
/// file of tests, which says `#![cfg(test)]`).
fn non_test_lines(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, line)| !matches!(line.trim(), "#[cfg(test)]" | "#![cfg(test)]"))
        .map(|(index, line)| (index + 1, line))
        .collect()
}

/// The string literals on a line (the text between unescaped double quotes
/// outside a `//` comment).
fn string_literals(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (&mut current, c) {
            (None, '/') if chars.peek() == Some(&'/') => break,
            (None, '"') => current = Some(String::new()),
            (Some(text), '\\') => {
                text.push(c);
                if let Some(next) = chars.next() {
                    text.push(next);
                }
            }
            (Some(_), '"') => out.extend(current.take()),
            (Some(text), c) => text.push(c),
            (None, _) => {}
        }
    }
    out
}

/// Whether a string names a command-line flag: `--` then a letter.
fn names_a_flag(text: &str) -> bool {
    text.match_indices("--").any(|(at, _)| {
        text[at + 2..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase())
    })
}

/// The findings of `check` on every non-test line of the files of `src/`
/// outside the folders `skip`, as `path:line: finding`.
fn scan(skip: &[&str], check: impl Fn(&str) -> Vec<String>) -> Vec<String> {
    let (src, files) = src_files();
    let mut found = Vec::new();
    for path in files
        .iter()
        .filter(|path| !skip.iter().any(|dir| path.starts_with(src.join(dir))))
    {
        let text = std::fs::read_to_string(path).unwrap();
        for (line_number, line) in non_test_lines(&text) {
            for finding in check(line) {
                found.push(format!("{}:{line_number}: {finding}", path.display()));
            }
        }
    }
    found
}

#[test]
fn only_the_trace_module_reads_profiler_json() {
    let found = scan(&["trace", "bin"], |line| {
        let code = line.split("//").next().unwrap_or("");
        ["serde_json::Value", "traceEvents"]
            .into_iter()
            .filter(|needle| code.contains(needle))
            .map(str::to_owned)
            .collect()
    });
    assert!(
        found.is_empty(),
        "only src/trace/ reads the profiler's JSON:\n{}",
        found.join("\n")
    );
}

#[test]
fn core_strings_name_no_command_line_flag() {
    // `present/command.rs` writes the capture helper's command line (another
    // program's flags, shown as a command, never asking for a memcast setting).
    let found = scan(&["web", "bin", "present/command.rs"], |line| {
        string_literals(line)
            .into_iter()
            .filter(|literal| names_a_flag(literal))
            .map(|literal| format!("{literal:?}"))
            .collect()
    });
    assert!(
        found.is_empty(),
        "core messages speak the user's terms (name the diag::Setting; the shells add their flag):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_flag_check_sees_flags_in_strings_only() {
    assert_eq!(
        string_literals(r#"err("pass --iterations 3", x) // --not-this"#),
        ["pass --iterations 3"]
    );
    assert!(names_a_flag("pass --iterations 3"));
    assert!(!names_a_flag("a -- b, x--1"));
    assert_eq!(string_literals(r#"f("a \"--b\" c")"#), [r#"a \"--b\" c"#]);
}

#[test]
fn long_files_say_why_at_their_top() {
    let (_, files) = src_files();
    let mut found = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let n_lines = text.lines().count();
        let has_reason = text
            .lines()
            .take(40)
            .any(|line| line.starts_with("//! Long file:"));
        if n_lines > MAX_LINES && !has_reason {
            found.push(format!("{}: {n_lines} lines", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "split these files, or say why not in a `//! Long file:` line at the top:\n{}",
        found.join("\n")
    );
}
