//! The job queue of the jobs and break-in suites.

use std::path::Path;

/// The ids of the jobs in `<queue>/<dir>`, sorted (none when there is no
/// such dir).
pub fn jobs_in(queue: &Path, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(queue.join(dir))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
                .map(|n| n.trim_end_matches(".json").to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
