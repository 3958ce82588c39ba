//! Reading the `events.jsonl` of belay's run and log directories.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The `events.jsonl` of `dir` (empty when there is none).
fn jsonl(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("events.jsonl")).unwrap_or_default()
}

/// Every event of each of `dirs`, in order; a line that is not JSON fails
/// the test.
pub fn read(dirs: &[PathBuf]) -> Vec<Value> {
    dirs.iter()
        .flat_map(|d| {
            jsonl(d)
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The events of `dir` so far (a line being written is left out).
pub fn complete(dir: &Path) -> Vec<Value> {
    jsonl(dir)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The events of `kind` among `events`.
pub fn of_kind(events: Vec<Value>, kind: &str) -> Vec<Value> {
    events.into_iter().filter(|e| e["kind"] == kind).collect()
}
