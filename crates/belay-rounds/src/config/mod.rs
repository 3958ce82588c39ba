//! The config: `agent-runner.toml` read as the peer writes it, checked, and
//! resolved into what a round needs. Every error names `file:line:col` where
//! there is one and says what to change.

mod agent;
mod monitor;
pub mod raw;
mod schedule;

use std::path::{Path, PathBuf};

pub use agent::{AgentConfig, PlacementKind};
pub use belay_record::line_col;
pub use monitor::{MonitorConfig, AUTH_FAIL_PATTERN};

use crate::schedule::Schedule;
use crate::RoundsError;
use raw::RawConfig;

/// The largest config file read (a config is a page of text).
pub(crate) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// What to do with a tree a round left dirty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirtyAction {
    Stash,
    Ignore,
    AutoCommit,
}

/// Where the round context goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextMode {
    Prepend,
    File,
    None,
}

/// What a rate limit or another transient agent error does to the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransientAction {
    BackOff,
    Skip,
    Stop,
}

/// A phase outside its schedule: wait for it, or skip to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhasePolicy {
    Wait,
    Skip,
}

#[derive(Debug, Clone)]
pub struct Runtime {
    pub work_dir: PathBuf,
    pub log_dir: PathBuf,
    pub round_budget_s: f64,
    pub restart_delay_s: f64,
    pub round_log_retention: u64,
    pub transient_error_action: TransientAction,
    pub max_rounds: Option<u64>,
    pub stop_file: Option<PathBuf>,
    pub fresh_eyes_every_n: Option<u64>,
    pub dry_run: bool,
    /// The grace after the terminal marker (the peer's
    /// `max_grace_after_result_s`, else its `sigterm_grace_s`).
    pub grace_after_result_s: f64,
}

#[derive(Debug, Clone)]
pub struct PromptConfig {
    pub files: Vec<PathBuf>,
    pub inject_context: bool,
    pub mode: ContextMode,
    pub separator: String,
    pub strip_frontmatter: bool,
}

#[derive(Debug, Clone)]
pub struct Phase {
    pub name: String,
    pub round_budget_s: Option<f64>,
    pub prompt_files: Option<Vec<PathBuf>>,
    pub agent: Option<AgentConfig>,
    pub schedule: Option<Schedule>,
}

/// belay's limits per round and per (UTC) day.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub round_cost_usd: Option<f64>,
    pub day_cost_usd: Option<f64>,
    pub round_turns: Option<u32>,
    pub day_turns: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The config file (absolute).
    pub path: PathBuf,
    /// The project's name (the work dir's), used in unit names and `{project}`.
    pub project: String,
    pub agent: AgentConfig,
    pub runtime: Runtime,
    pub prompt: PromptConfig,
    pub dirty_action: DirtyAction,
    pub stash_idempotency_s: f64,
    pub phases: Vec<Phase>,
    pub phase_policy: PhasePolicy,
    pub schedule: Schedule,
    pub monitor: MonitorConfig,
    pub limits: Limits,
    /// Keys that load but do nothing in belay, with why (`doctor` shows them).
    pub notes: Vec<String>,
    /// The file's text as loaded.
    pub source: String,
}

/// Points into the config text.
pub(crate) struct Src<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

impl Src<'_> {
    pub fn at(&self, span: std::ops::Range<usize>) -> String {
        let (l, c) = line_col(self.text, span.start);
        format!("{}:{l}:{c}", self.path.display())
    }

    pub fn err(&self, span: std::ops::Range<usize>, msg: impl std::fmt::Display) -> RoundsError {
        RoundsError::Config(format!("{}: {msg}", self.at(span)))
    }

    pub fn err_file(&self, msg: impl std::fmt::Display) -> RoundsError {
        RoundsError::Config(format!("{}: {msg}", self.path.display()))
    }
}

/// Expand `~` and `{project}` in a path, and make it absolute against `base`.
pub(crate) fn expand(p: &str, base: &Path, project: &str) -> PathBuf {
    let p = p.replace("{project}", project);
    let p = match p.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(rest))
            .unwrap_or_else(|| PathBuf::from(&p)),
        None if p == "~" => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(&p)),
        None => PathBuf::from(&p),
    };
    if p.is_absolute() {
        p
    } else {
        base.join(p)
    }
}

/// The name of a project: the work dir's last component, kept to the
/// characters a unit instance name can hold.
pub fn project_name(work_dir: &Path) -> String {
    let base = work_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "project".into());
    let s: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        format!("p{s}")
    } else {
        s
    }
}

impl Config {
    /// Read and check `path`, as it is on disk (for a run, see
    /// [`crate::trusted::open`], which goes by belay's trusted copy). Its
    /// path is made canonical, as the work dir is: a config reached through a
    /// link into the work tree is still known as the tree's own. It is then
    /// read without following anything, as a regular file of at most 1 MiB
    /// (a FIFO or a device is refused at once).
    pub fn load(path: &Path) -> Result<Config, RoundsError> {
        crate::trusted::load_fresh(path).map(|(cfg, _)| cfg)
    }

    /// Check `text`, the config at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Config, RoundsError> {
        let src = Src { path, text };
        // The version first: a file of another version fails on its version,
        // not on whatever key that version lacks.
        let table: toml::Table = toml::from_str(text).map_err(|e| toml_error(&src, &e))?;
        if !table.contains_key("schema_version") {
            return Err(src.err_file(
                "no `schema_version`: add `schema_version = 1` at the top (the file is from an older cli-agent-runner; `agent-runner migrate` also upgrades it)",
            ));
        }
        let raw: RawConfig = toml::from_str(text).map_err(|e| toml_error(&src, &e))?;
        match raw.schema_version.as_ref().map(|v| *v.get_ref()) {
            Some(1) => {}
            None => {
                return Err(src.err_file(
                    "no `schema_version`: add `schema_version = 1` at the top (the file is from an older cli-agent-runner; `agent-runner migrate` also upgrades it)",
                ))
            }
            Some(v) => {
                let span = raw.schema_version.as_ref().map(|s| s.span()).unwrap_or(0..0);
                return Err(src.err(
                    span,
                    format!("schema_version {v} is not supported: belay reads schema_version = 1"),
                ));
            }
        }
        for (name, table, why) in [
            ("goal", &raw.goal, "belay has no goal ledger; check progress with a pipeline gate (`belay run`) or the plan loop's reviewer (`belay plan`)"),
            ("plugins", &raw.plugins, "belay's CLI adapters are built in and cannot be switched off"),
            ("llm", &raw.llm, "the model endpoint goes in [agent] model_url, model_api and model_key_env"),
        ] {
            if let Some(t) = table {
                return Err(src.err(t.span(), format!("[{name}] is not supported by belay: {why}. Remove the table.")));
            }
        }
        resolve::resolve(&src, raw)
    }

    /// The phase of round `n` (1-based): `list[(n-1) % len]`.
    pub fn phase_of(&self, n: u64) -> Option<(usize, &Phase)> {
        if self.phases.is_empty() || n == 0 {
            return None;
        }
        let i = ((n - 1) % self.phases.len() as u64) as usize;
        self.phases.get(i).map(|p| (i, p))
    }

    /// The budget of a round in `phase`.
    pub fn budget_s(&self, phase: Option<&Phase>) -> f64 {
        phase
            .and_then(|p| p.round_budget_s)
            .unwrap_or(self.runtime.round_budget_s)
    }

    /// The agent of a round in `phase`.
    pub fn agent_of<'a>(&'a self, phase: Option<&'a Phase>) -> &'a AgentConfig {
        phase.and_then(|p| p.agent.as_ref()).unwrap_or(&self.agent)
    }

    /// The prompt files of a round in `phase`.
    pub fn prompt_files<'a>(&'a self, phase: Option<&'a Phase>) -> &'a [PathBuf] {
        phase
            .and_then(|p| p.prompt_files.as_deref())
            .unwrap_or(&self.prompt.files)
    }

    /// The directory of the config file (relative paths resolve here).
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }
}

/// toml's message, at the line it names, with what to do about it.
fn toml_error(src: &Src<'_>, e: &toml::de::Error) -> RoundsError {
    let msg = e.message().trim().to_string();
    let hint = if msg.starts_with("unknown field") {
        ". Remove or rename the key (cli-agent-runner 0.3.14's keys are listed in docs/rounds.md)"
    } else if msg.starts_with("missing field") {
        ". Add it (`belay rounds init` writes a complete file)"
    } else {
        ""
    };
    match e.span() {
        Some(span) => src.err(span, format!("{msg}{hint}")),
        None => src.err_file(format!("{msg}{hint}")),
    }
}

mod resolve;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    proptest! {
        /// Whatever the text, parsing returns a config or an error naming
        /// the file: it never panics.
        #[test]
        fn any_text_gives_a_config_or_an_error_naming_the_file(s in "\\PC{0,300}") {
            let p = std::path::Path::new("/nonexistent/agent-runner.toml");
            if let Err(e) = super::Config::parse(p, &s) {
                prop_assert!(e.to_string().contains("agent-runner.toml"), "{e}");
            }
        }

        /// Keys shuffled into a valid file: an unknown key is always named
        /// with its line.
        #[test]
        fn an_unknown_key_names_its_line(key in "[a-z]{3,10}_x", line in 0usize..3) {
            let mut lines = vec!["schema_version = 1", "[agent]", "command = [\"a\"]", "prompt_arg_template = [\"{prompt}\"]", "[runtime]", "work_dir = \"/\"", "log_dir = \"/tmp/l\"", "[prompt]", "file = \"p\""];
            let at = [2, 5, 8][line];
            let k = format!("{key} = 1");
            lines.insert(at, &k);
            let text = lines.join("\n");
            let e = super::Config::parse(std::path::Path::new("/x/c.toml"), &text).unwrap_err().to_string();
            prop_assert!(e.contains(&format!("/x/c.toml:{}:1", at + 1)) && e.contains(&key), "{e}");
        }
    }
}
