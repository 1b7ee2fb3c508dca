//! Architecture invariants checked on the source text: the core (everything in
//! `src/` except `src/web/` and `src/bin/`) does no I/O, reads no clock or
//! environment, never prints and knows nothing of the browser.

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
