//! Commands belay itself runs over a work tree after an agent (the plan
//! loop's gate, a job's checks): each in turn, in a fresh box with no network
//! and no agent, its output streamed to a log and its tail kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use belay_record::Redactor;
use belay_sandbox::{ContainerRuntime, ExecSpec, NoopObserver};
use serde::Serialize;

use crate::{AgentBox, AgentError, AgentSpec, BoxSpec};

/// One command's result.
#[derive(Debug, Clone, Serialize)]
pub struct CommandRun {
    pub name: String,
    pub command: String,
    pub exit_code: i64,
    pub timed_out: bool,
    pub duration_s: f64,
    /// Its last 4,000 characters of output (stdout, then stderr), redacted.
    pub output_tail: String,
    /// Its whole output, redacted (`<log_prefix><name>.log`).
    pub log: PathBuf,
}

impl CommandRun {
    pub fn passed(&self) -> bool {
        self.exit_code == 0 && !self.timed_out
    }
}

/// Where and what to run.
pub struct Checks<'a> {
    pub rt: Arc<dyn ContainerRuntime>,
    pub image: &'a str,
    pub run_id: &'a str,
    /// The container's `belay.kind` label.
    pub kind: &'a str,
    pub tree: &'a Path,
    pub git: Option<&'a belay_vcs::Git>,
    /// belay's own directory for the box's files.
    pub records: PathBuf,
    /// `(name, shell command)`, run in order; the first failure stops them.
    pub commands: &'a [(String, String)],
    pub timeout: Duration,
    /// The log of command `name` is `<log_prefix><name>.log`.
    pub log_prefix: PathBuf,
    pub redactor: &'a Redactor,
    /// The image's environment directories (an env build's image), mounted
    /// read-only: a set no agent ever had writable.
    pub env: &'a belay_sandbox::envimage::EnvVolumes,
}

/// What every check command runs with besides `HOME`: the test runners'
/// own caches off, so that running the project's tests writes nothing a
/// commit would hold (Python's bytecode, pytest's cache directory) and the
/// gate judges the tree as the developer left it. Python's bytecode is
/// neither written nor read in the tree: an ignored `__pycache__` the
/// developer planted (the right code compiled, the wrong code committed)
/// would otherwise be what the tests import.
pub const CHECK_ENV: [(&str, &str); 3] = [
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("PYTHONPYCACHEPREFIX", "/tmp/.belay-pycache"),
    ("PYTEST_ADDOPTS", "-p no:cacheprovider"),
];

/// The last `n` characters of `s`.
pub fn last_chars(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        return s.to_string();
    }
    s.chars().skip(count - n).collect()
}

/// Run the commands; the results of those that ran (the last one failed, or
/// all passed).
pub async fn run(c: Checks<'_>) -> Result<Vec<CommandRun>, AgentError> {
    if c.commands.is_empty() {
        return Ok(vec![]);
    }
    // No agent runs here: the built-in spec mounts no CLI.
    let none = AgentSpec {
        kind: crate::AgentKind::Builtin,
        model: None,
    };
    let gate_box = AgentBox::open(BoxSpec {
        rt: c.rt.clone(),
        image: c.image.to_string(),
        run_id: c.run_id.to_string(),
        kind: c.kind.to_string(),
        repo: c.tree.to_path_buf(),
        git: c.git,
        records: c.records,
        agent: &none,
        model_url: None,
        network: false,
        keep: false,
        extras: crate::sandbox::BoxExtras {
            env: c.env.clone(),
            env_read_only: true,
            ..Default::default()
        },
    })
    .await?;
    let mut ran = Vec::new();
    for (name, cmd) in c.commands {
        let log = PathBuf::from(format!("{}{name}.log", c.log_prefix.display()));
        if let Some(d) = log.parent() {
            if let Err(e) = fs_err::create_dir_all(d) {
                let _ = gate_box.close().await;
                return Err(AgentError::Io(e.to_string()));
            }
        }
        let out =
            c.rt.exec(
                gate_box.id(),
                &ExecSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), cmd.to_string()],
                    working_dir: Some(crate::sandbox::WORKDIR.into()),
                    env: std::iter::once(("HOME", "/tmp"))
                        .chain(CHECK_ENV)
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    timeout: Some(c.timeout),
                    log_path: log.clone(),
                    log_limit: None,
                },
                c.redactor,
                &NoopObserver,
            )
            .await;
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                let _ = gate_box.close().await;
                return Err(e.into());
            }
        };
        let mut tail = out.stdout_tail.clone();
        if !out.stderr_tail.is_empty() {
            tail.push_str(&out.stderr_tail);
        }
        let run = CommandRun {
            name: name.clone(),
            command: cmd.clone(),
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            duration_s: out.duration.as_secs_f64(),
            output_tail: last_chars(&tail, 4000),
            log,
        };
        let passed = run.passed();
        ran.push(run);
        if !passed {
            break;
        }
    }
    gate_box.close().await?;
    Ok(ran)
}
