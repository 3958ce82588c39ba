//! Tests over the workspace's sources: what must hold of every crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// Every crate's `src/*.rs`, without its unit tests.
pub(crate) fn sources() -> Vec<(PathBuf, String)> {
    fn walk(d: &Path, out: &mut Vec<(PathBuf, String)>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                // The code, not its unit tests.
                let code = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
                out.push((p, code));
            }
        }
    }
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for c in std::fs::read_dir(&crates).unwrap().flatten() {
        let src = c.path().join("src");
        if src.is_dir() {
            walk(&src, &mut out);
        }
    }
    assert!(out.len() > 100, "the crates' sources were not found");
    out
}

/// No library prints: engines emit typed events and the binary renders
/// them (one output path). Only `crates/belay` writes to the terminal.
#[test]
fn no_library_prints() {
    let print = regex::Regex::new(r"\b(e?println|e?print|dbg)!\(").unwrap();
    for (p, s) in sources() {
        // The binary's own sources (`crates/belay/../belay/src`).
        if p.to_string_lossy().contains("/../belay/src/") {
            continue;
        }
        for (n, line) in s.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            assert!(
                !print.is_match(code),
                "{}:{}: a library prints; emit an event or return the text",
                p.display(),
                n + 1
            );
        }
    }
}
