//! The round supervisor's project, shared by the rounds and break-in suites:
//! the prompt, the start of a config, and waiting for what a round does.

use std::path::Path;
use std::time::{Duration, Instant};

/// A prompt that passes the smoke check.
pub fn prompt_text() -> String {
    format!(
        "Work on the project, round after round.\n{}",
        "Keep going. ".repeat(50)
    )
}

/// A config's `[agent]` table (`command` of `args`, the prompt on stdin,
/// `placement`) and its `[runtime]` table up to `log_dir`: the caller adds
/// the other `[runtime]` lines and what follows.
pub fn config_head(args: &[&str], placement: &str, repo: &Path, logs: &Path) -> String {
    let command: Vec<String> = args.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        r#"schema_version = 1
[agent]
command = [{command}]
prompt_arg_template = []
prompt_delivery = "stdin"
placement = "{placement}"

[runtime]
work_dir = "{repo}"
log_dir = "{logs}"
"#,
        command = command.join(", "),
        repo = repo.display(),
        logs = logs.display(),
    )
}

/// Waits until `f` holds; fails the test if `what` did not happen within
/// `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
