//! `init`: `agent-runner.toml`, `prompts/main.md` and a `.gitignore` line
//! in a git work tree, for a preset CLI; committed unless asked not to.

use std::path::{Path, PathBuf};

use crate::RoundsError;

pub const PRESETS: [&str; 8] = [
    "claude",
    "codex",
    "gemini",
    "aider",
    "codewhale",
    "kimi",
    "pi",
    "script",
];

const PROMPT: &str = "# Agent Prompt

You are an autonomous agent working on this project. Each round begins with a
`round-context` JSON block prepended above this prompt — read it first.

If `round_num == 1`: orient yourself with the project structure (README, file tree).
If `previous.outcome` is not `clean`: investigate what went wrong before resuming.
If `orphan_stashes` is present: recover a stash with `git stash apply <ref>`, using
its `ref` field (the stash commit SHA) — a fixed SHA is safe however the stash list
moves, unlike a `stash@{N}` index. To abandon it, leave it be.

Always: commit your work before exiting the round. The supervisor stashes what
you leave uncommitted, but explicit commits with meaningful messages are better.
";

fn agent_table(preset: &str) -> Option<&'static str> {
    Some(match preset {
        "claude" => {
            r#"[agent]
command = ["claude", "--dangerously-skip-permissions",
           "--verbose", "--output-format", "stream-json"]
prompt_arg_template = ["-p"]
prompt_delivery = "stdin"
name = "claude"

[agent.env]
DISABLE_AUTOUPDATER = "1"
# Telemetry, feature flags and error reports off: a sandbox cannot reach
# them, and each would wait out a lookup.
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1"
"#
        }
        "codex" => {
            r#"[agent]
command = ["codex", "exec", "--json", "--skip-git-repo-check",
           "--dangerously-bypass-approvals-and-sandbox",
           "-c", "analytics.enabled=false", "-c", "features.plugins=false"]
prompt_arg_template = ["-"]
prompt_delivery = "stdin"
name = "codex"
terminal_marker = "\"type\":\"turn.completed\""
"#
        }
        "gemini" => {
            r#"[agent]
command = ["gemini", "--yolo", "--skip-trust", "-o", "stream-json"]
prompt_arg_template = ["-p", "{prompt}"]
name = "gemini"
"#
        }
        "aider" => {
            r#"[agent]
command = ["aider", "--yes-always", "--no-stream", "--analytics-disable"]
prompt_arg_template = ["--message", "{prompt}"]
name = "aider"
placement = "host"   # aider is not in belay's image: it runs on this machine
"#
        }
        "codewhale" => {
            r#"[agent]
command = ["codewhale", "exec", "--auto", "--output-format", "stream-json"]
prompt_arg_template = ["{prompt}"]
name = "codewhale"
terminal_marker = "\"type\":\"metadata\""
placement = "host"
"#
        }
        "kimi" => {
            r#"[agent]
command = ["kimi", "--output-format", "stream-json"]
prompt_arg_template = ["-p", "{prompt}"]
name = "kimi"
placement = "host"
"#
        }
        "pi" => {
            r#"[agent]
command = ["pi", "-p", "-na", "--mode", "json", "--model", "PROVIDER/MODEL"]
prompt_arg_template = ["{prompt}"]
name = "pi"
terminal_marker = "\"type\":\"agent_end\""
placement = "host"
"#
        }
        "script" => {
            r#"[agent]
command = ["./agent.sh"]
prompt_arg_template = []
prompt_delivery = "stdin"
name = "script"
"#
        }
        _ => return None,
    })
}

/// The config text for `preset` in the project `project`.
pub fn render(preset: &str, project: &str) -> Result<String, RoundsError> {
    let agent = agent_table(preset).ok_or_else(|| {
        RoundsError::Config(format!(
            "unknown preset `{preset}`: use one of {}",
            PRESETS.join(", ")
        ))
    })?;
    Ok(format!(
        "schema_version = 1
# agent-runner.toml — written by `belay rounds init --preset {preset}`.
# The keys are cli-agent-runner's; belay's own are documented in docs/rounds.md.

{agent}
[runtime]
work_dir = \".\"
log_dir = \"~/.agent-runner/{project}/logs\"
round_budget_s = 1800
restart_delay_s = 3

[prompt]
file = \"./prompts/main.md\"
inject_context = true

[vcs]
dirty_action = \"stash\"
stash_idempotency_s = 5

[monitor]
auto_stop_on = [\"oauth_fail\", \"disk_critical\"]
"
    ))
}

pub struct InitResult {
    pub created: Vec<PathBuf>,
    pub committed: Option<String>,
}

/// Write the files into `work_dir` (a git work tree).
pub async fn scaffold(
    work_dir: &Path,
    preset: &str,
    force: bool,
    commit: bool,
) -> Result<InitResult, RoundsError> {
    if !work_dir.join(".git").exists() {
        return Err(RoundsError::Config(format!(
            "{} is not a git work tree: run `git init` first",
            work_dir.display()
        )));
    }
    let project = crate::config::project_name(work_dir);
    let toml_path = work_dir.join("agent-runner.toml");
    if toml_path.exists() && !force {
        return Err(RoundsError::Config(format!(
            "{} exists: pass --force to overwrite it",
            toml_path.display()
        )));
    }
    let mut created = Vec::new();
    belay_record::atomic_write(&toml_path, render(preset, &project)?.as_bytes())?;
    created.push(toml_path);
    let prompts = work_dir.join("prompts");
    fs_err::create_dir_all(&prompts).map_err(|e| RoundsError::io("cannot create", &prompts, e))?;
    let prompt = prompts.join("main.md");
    if !prompt.exists() || force {
        belay_record::atomic_write(&prompt, PROMPT.as_bytes())?;
        created.push(prompt);
    }
    let gi = work_dir.join(".gitignore");
    // An agent may have left anything at .gitignore (a FIFO, a link to a
    // host file): it is read only as a regular file of the tree.
    let old = belay_sandbox::hostfs::read(work_dir, ".gitignore", 1 << 20)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    if !old.lines().any(|l| l.trim() == "logs/") {
        let sep = if old.is_empty() || old.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        belay_record::atomic_write(&gi, format!("{old}{sep}logs/\n").as_bytes())?;
        created.push(gi);
    }
    let committed = if commit {
        let git = belay_vcs::Git::open(work_dir, &belay_record::no_hooks_dir()).await?;
        let paths = created
            .iter()
            .filter_map(|p| {
                p.strip_prefix(work_dir)
                    .ok()
                    .map(|r| r.display().to_string())
            })
            .collect();
        match git
            .commit_checked(belay_vcs::CommitRequest {
                message: format!("belay rounds init --preset {preset}"),
                author: None,
                exclude: vec![],
                exclude_globs: vec![],
                allow_empty: false,
                paths,
                submodules: vec![],
                scan: Box::new(|_, _| Ok(None)),
            })
            .await?
        {
            belay_vcs::CommitOutcome::Committed(c) => Some(c.sha),
            _ => None,
        }
    } else {
        None
    };
    Ok(InitResult { created, committed })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_prompt_passes_the_smoke_check() {
        assert!(crate::prompt::smoke(super::PROMPT).is_ok());
    }
}
