//! The startup battery: what `doctor` and every round check before a round
//! is burnt. A permanent failure (the config, the prompt, the agent) is exit
//! 78; a passing one of the environment (an unwritable log dir, no engine)
//! is 76, which serve retries.

use std::path::Path;

use belay_agent::AgentKind;
use serde::Serialize;

use crate::config::{AgentConfig, Config, PlacementKind};
use crate::prompt::MAX_PROMPT_FILE;

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub how_to_fix: String,
    /// A failure no retry fixes (the config): exit 78, else 76.
    pub permanent: bool,
}

fn pass(name: &str) -> Check {
    Check {
        name: name.into(),
        ok: true,
        reason: String::new(),
        how_to_fix: String::new(),
        permanent: false,
    }
}

fn fail(name: &str, reason: String, fix: &str, permanent: bool) -> Check {
    Check {
        name: name.into(),
        ok: false,
        reason,
        how_to_fix: fix.into(),
        permanent,
    }
}

/// Run every check (none stops the others, so one report lists them all).
pub fn run(cfg: &Config) -> Vec<Check> {
    let mut out = vec![pass("config_loaded")];
    out.push(log_dir_writable(&cfg.runtime.log_dir));
    out.push(work_dir_is_git(&cfg.runtime.work_dir));
    out.push(control_plane_outside(cfg));
    let first = cfg.prompt.files.first();
    // Read as a round reads it: in the work tree, a regular file reached
    // through real dirs (a link, a FIFO or a device there is refused).
    let name = "prompt_file_exists";
    let root = &cfg.runtime.work_dir;
    out.push(
        match first.map(|f| (f, crate::trusted::read_file(root, f, MAX_PROMPT_FILE))) {
            Some((_, Ok(Some(_)))) => pass(name),
            Some((f, Ok(None))) => fail(
                name,
                format!("{} does not exist", f.display()),
                "write the prompt there, or point [prompt] file at it",
                true,
            ),
            Some((f, Err(e))) => fail(
                name,
                format!("{}: {e}", f.display()),
                "make it a regular file of at most 4 MiB, not a link inside the work tree",
                true,
            ),
            None => fail(
                "prompt_file_exists",
                "no prompt file".into(),
                "set [prompt] file",
                true,
            ),
        },
    );
    out.push(smoke(cfg, None, "prompt_smoke_passes"));
    for p in &cfg.phases {
        if p.prompt_files.is_some() {
            out.push(smoke(
                cfg,
                Some(p),
                &format!("prompt_smoke_passes:{}", p.name),
            ));
        }
    }
    out.push(agent_cli(
        &cfg.agent,
        &cfg.runtime.work_dir,
        "agent_cli_in_path",
    ));
    for p in &cfg.phases {
        if let Some(a) = &p.agent {
            out.push(agent_cli(
                a,
                &cfg.runtime.work_dir,
                &format!("agent_cli_in_path:{}", p.name),
            ));
        }
    }
    out
}

fn log_dir_writable(dir: &Path) -> Check {
    let name = "log_dir_writable";
    if let Err(e) = fs_err::create_dir_all(dir) {
        return fail(
            name,
            e.to_string(),
            "create the directory, or fix its owner and mode",
            false,
        );
    }
    let probe = dir.join(format!(".belay-probe-{}", std::process::id()));
    match fs_err::write(&probe, b"ok") {
        Ok(()) => {
            let _ = fs_err::remove_file(&probe);
            pass(name)
        }
        Err(e) => fail(
            name,
            e.to_string(),
            "make the log dir writable (or free space on its disk)",
            false,
        ),
    }
}

fn work_dir_is_git(dir: &Path) -> Check {
    let name = "work_dir_is_git_repo";
    if dir.join(".git").exists() {
        pass(name)
    } else {
        fail(
            name,
            format!(
                "{} is not the top of a git work tree (no .git)",
                dir.display()
            ),
            "run `git init` there, or point [runtime] work_dir at the repository",
            true,
        )
    }
}

/// The log dir holds the status, the events and the stashes' record: an
/// agent that could write it could forge them.
fn control_plane_outside(cfg: &Config) -> Check {
    let name = "control_plane_outside_container";
    let log =
        std::path::absolute(&cfg.runtime.log_dir).unwrap_or_else(|_| cfg.runtime.log_dir.clone());
    if log.starts_with(&cfg.runtime.work_dir) {
        let fix =
            "put log_dir outside the work tree (the default is ~/.agent-runner/{project}/logs)";
        return fail(
            name,
            format!(
                "log_dir {} is inside the work tree {}, which the agent can write: it could forge the status, the events and the stash records",
                log.display(),
                cfg.runtime.work_dir.display()
            ),
            fix,
            true,
        );
    }
    let state = std::path::absolute(belay_record::state_home())
        .unwrap_or_else(|_| belay_record::state_home());
    if state.starts_with(&cfg.runtime.work_dir) {
        return fail(
            name,
            format!(
                "belay's state home {} is inside the work tree {}, which the agent can write: it could rewrite the trusted copies of the config and the prompts",
                state.display(),
                cfg.runtime.work_dir.display()
            ),
            "set BELAY_STATE_HOME to a directory outside the work tree (the default is ~/.local/state/belay)",
            true,
        );
    }
    pass(name)
}

fn smoke(cfg: &Config, phase: Option<&crate::config::Phase>, name: &str) -> Check {
    match crate::prompt::assemble_files(cfg, phase).and_then(|p| crate::prompt::smoke(&p)) {
        Ok(()) => pass(name),
        Err(e) => fail(
            name,
            e.to_string(),
            "write a complete prompt (at least 500 bytes, starting with text)",
            true,
        ),
    }
}

/// The program resolves as it will be run: a path (relative to the work
/// dir) must exist and be executable; a bare name must be on PATH, or for
/// a container the pinned CLI must be installed.
fn agent_cli(a: &AgentConfig, work_dir: &Path, name: &str) -> Check {
    let in_container = a.placement == PlacementKind::Container;
    let program = match &a.spec.kind {
        AgentKind::Builtin => return pass(name),
        // In a container a bare peer CLI name is the pinned CLI.
        AgentKind::Command { program, .. }
            if in_container && matches!(program.as_str(), "claude" | "codex" | "gemini") =>
        {
            match belay_agent::session::program_of(&a.spec, true) {
                Ok(p) if p.starts_with('/') => p,
                _ => return fail(
                    name,
                    format!("`{program}` is not installed for belay's container"),
                    "run ./scripts/setup-host.sh --agents (it pins the agent CLIs under /opt/belay-agents)",
                    true,
                ),
            }
        }
        AgentKind::Command { program, .. } => program.clone(),
        _ => match belay_agent::session::program_of(&a.spec, in_container) {
            Ok(p) => p,
            Err(e) => return fail(name, e.to_string(), "run ./scripts/setup-host.sh --agents", true),
        },
    };
    let p = Path::new(&program);
    let found = if p.components().count() > 1 {
        let p = if p.is_relative() {
            work_dir.join(p)
        } else {
            p.to_path_buf()
        };
        p.is_file().then_some(p)
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(p))
                .find(|c| c.is_file())
        })
    };
    let Some(found) = found else {
        return fail(
            name,
            format!("`{program}` is not a file or on PATH"),
            "install the CLI, or give its full path in [agent] command",
            true,
        );
    };
    use std::os::unix::fs::PermissionsExt;
    match fs_err::metadata(&found) {
        Ok(m) if m.permissions().mode() & 0o111 != 0 => pass(name),
        _ => fail(
            name,
            format!("{} is not executable", found.display()),
            "chmod +x it",
            true,
        ),
    }
}

/// The exit code a failed battery gives: 78 when any failure is permanent.
pub fn exit_code(checks: &[Check]) -> Option<u8> {
    let failed: Vec<&Check> = checks.iter().filter(|c| !c.ok).collect();
    if failed.is_empty() {
        None
    } else if failed.iter().any(|c| c.permanent) {
        Some(crate::exit::CONFIG)
    } else {
        Some(crate::exit::ENVIRONMENT)
    }
}
