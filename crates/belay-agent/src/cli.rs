//! Agent CLI adapters and the runner that watches them.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use belay_model::{Prices, Secret};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::event::Tally;
use crate::parse::{ClaudeParser, CodexParser, GeminiParser, PlainParser, StreamParser};
use crate::{AgentError, AgentEvent, AgentReport, Limits, StopReason};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CliKind {
    Claude,
    Codex,
    Gemini,
    /// xAI's grok CLI (`grok -p`): stdout is the answer.
    Grok,
    /// Google's Antigravity CLI (`agy -p`): stdout is the answer.
    Antigravity,
    /// Any command with the prompt as an argument or on stdin: stdout is the answer.
    Plain,
}

impl std::str::FromStr for CliKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "claude" => Ok(CliKind::Claude),
            "codex" => Ok(CliKind::Codex),
            "gemini" => Ok(CliKind::Gemini),
            "grok" => Ok(CliKind::Grok),
            "antigravity" | "agy" => Ok(CliKind::Antigravity),
            "plain" => Ok(CliKind::Plain),
            o => Err(format!(
                "unknown agent CLI `{o}`: use claude, codex, gemini, grok, antigravity or plain"
            )),
        }
    }
}

/// Where a CLI should send its model requests (instead of its vendor's default).
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub base_url: String,
    /// The dialect it speaks: codex takes responses or chat-completions;
    /// Claude Code only anthropic; gemini none of belay's (it speaks Google's API).
    pub api: belay_model::Api,
    pub key: Option<Secret>,
}

/// codex's `-c` arguments for belay's endpoint: a `belay` provider at its
/// address in its wire dialect, the key passed by name.
fn codex_provider_args(e: &Endpoint, env: &mut Vec<(String, String)>) -> Vec<String> {
    let wire = match e.api {
        belay_model::Api::ChatCompletions => "chat",
        _ => "responses",
    };
    let mut cfg = vec![
        "model_provider=belay".to_string(),
        "model_providers.belay.name=\"belay\"".to_string(),
        format!("model_providers.belay.base_url={}", toml_str(&e.base_url)),
        format!("model_providers.belay.wire_api=\"{wire}\""),
    ];
    if let Some(k) = &e.key {
        cfg.push("model_providers.belay.env_key=\"BELAY_AGENT_API_KEY\"".into());
        env.push(("BELAY_AGENT_API_KEY".into(), k.expose().to_string()));
    }
    cfg.into_iter()
        .flat_map(|c| ["-c".to_string(), c])
        .collect()
}

/// The one dialect table ([`crate::spec::AgentKind::dialects`]) for a CLI of
/// `kind`, checked again where its command is built (a mode checks it before
/// any work).
fn dialect_of(kind: CliKind, e: &Endpoint) -> Result<(), AgentError> {
    let Some(kind) = kind.agent_kind() else {
        return Ok(());
    };
    let spec = crate::AgentSpec { kind, model: None };
    spec.check_dialect("CLI", e.api, &e.base_url, |a| {
        format!("point it at a `{a}` endpoint")
    })?;
    Ok(())
}

impl CliKind {
    /// The variables a CLI of this kind reads its model's address and key
    /// from (a peer config names its model with them).
    pub fn endpoint_vars(self) -> Option<(&'static str, &'static str)> {
        match self {
            CliKind::Claude => Some(("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")),
            CliKind::Codex => Some(("OPENAI_BASE_URL", "OPENAI_API_KEY")),
            CliKind::Gemini => Some(("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY")),
            CliKind::Grok | CliKind::Antigravity | CliKind::Plain => None,
        }
    }

    /// The dialect it speaks first (what it is given when none is named),
    /// from the one table.
    pub fn native_dialect(self) -> Option<belay_model::Api> {
        self.agent_kind().and_then(|k| k.native_dialect())
    }

    /// The named agent whose dialects it speaks.
    fn agent_kind(self) -> Option<crate::AgentKind> {
        match self {
            CliKind::Claude => Some(crate::AgentKind::Claude),
            CliKind::Codex => Some(crate::AgentKind::Codex),
            CliKind::Gemini => Some(crate::AgentKind::Gemini),
            CliKind::Grok | CliKind::Antigravity | CliKind::Plain => None,
        }
    }
}

/// Claude Code's and gemini's endpoint: its address and key variables.
/// Headless, gemini also needs the workspace trusted and API-key auth chosen
/// in its settings (a bare base URL makes it pick a gateway auth it
/// refuses): the launcher writes [`GEMINI_SETTINGS`] to a settings home of
/// belay's. (codex takes its endpoint as arguments: [`codex_provider_args`].)
fn endpoint_env(kind: CliKind, e: &Endpoint, env: &mut Vec<(String, String)>) {
    let Some((url_var, key_var)) = kind.endpoint_vars() else {
        return;
    };
    // Claude Code and gemini add their API's version path themselves
    // (`/v1/messages`, `/v1beta/models/…`): a base ending in `/v1`, as belay's
    // own clients take it, would be asked for `/v1/v1/…`.
    let base = e.base_url.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    env.push((url_var.into(), base.to_string()));
    if let Some(k) = &e.key {
        env.push((key_var.into(), k.expose().to_string()));
    }
    if kind == CliKind::Gemini {
        env.push(("GEMINI_CLI_TRUST_WORKSPACE".into(), "true".into()));
        env.push(("BELAY_GEMINI_SETTINGS".into(), GEMINI_SETTINGS.into()));
    }
}

/// gemini's settings when belay gives it an endpoint: API-key auth.
/// Usage statistics and the update check off: from a sandbox their hosts are
/// unreachable and each would wait out a lookup.
pub const GEMINI_SETTINGS: &str = r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"privacy":{"usageStatisticsEnabled":false},"general":{"enableAutoUpdate":false,"enableAutoUpdateNotification":false}}"#;

/// codex's analytics (its metrics exporter) and its plugin sync off: in a
/// sandbox their hosts are unreachable and codex waits for each lookup (5 s
/// a call) before it exits. No environment variable does it in 0.171.
pub const CODEX_QUIET_ARGS: [&str; 4] = [
    "-c",
    "analytics.enabled=false",
    "-c",
    "features.plugins=false",
];

/// What to run for one prompt.
#[derive(Debug, Clone)]
pub struct CliCommand {
    /// The program first.
    pub argv: Vec<String>,
    pub stdin: Option<String>,
    /// Additions to the scrubbed environment.
    pub env: Vec<(String, String)>,
    /// The prompt, for the launcher to write to this path before the CLI
    /// starts (CLIs that take a prompt only as an argument are given an
    /// instruction to read this file, so that the prompt is never in argv).
    pub prompt_file: Option<(String, String)>,
}

/// An agent CLI and how to call it.
#[derive(Debug, Clone)]
pub struct CliAgent {
    pub kind: CliKind,
    /// The executable: a name on PATH or a path.
    pub program: String,
    /// What runs [`CliAgent::program`] where it is a script whose own `#!`
    /// would find another program (a pinned node CLI in a container runs on
    /// belay's node, not on the project's `node` on `PATH`).
    pub interpreter: Option<String>,
    pub model: Option<String>,
    /// Plain CLIs: the arguments, with `{prompt}` where the prompt goes
    /// (e.g. `["--message", "{prompt}"]`). Without `{prompt}`, it goes on stdin.
    pub template: Vec<String>,
    /// Send the prompt on stdin instead of as an argument (long prompts).
    pub prompt_on_stdin: bool,
    /// For grok and agy, which take a prompt only as an argument: where the
    /// launcher writes the prompt, which the argument then names.
    pub prompt_file: Option<String>,
    /// Let the CLI run tools without asking. An explicit opt-in: off by default.
    pub auto_approve: bool,
    pub endpoint: Option<Endpoint>,
    /// The CLI's own turn limit flag, where it has one (belay enforces its own anyway).
    pub max_turns: Option<u32>,
    pub extra_args: Vec<String>,
    /// A plain command that is one of the known CLIs with its event stream
    /// on (`claude … --output-format stream-json`): read that stream, for
    /// the usage, turns and cost (see [`stream_of`]).
    pub stream: Option<CliKind>,
}

/// The event stream a plain command prints, when it is a known CLI asked for
/// its JSON stream: `claude`/`gemini` with `stream-json`, `codex exec --json`.
pub fn stream_of(program: &str, args: &[String]) -> Option<CliKind> {
    let base = std::path::Path::new(program).file_name()?.to_str()?;
    let has = |w: &str| args.iter().any(|a| a == w || a.ends_with(&format!("={w}")));
    match base {
        "claude" if has("stream-json") => Some(CliKind::Claude),
        "gemini" if has("stream-json") => Some(CliKind::Gemini),
        "codex" if has("--json") && has("exec") => Some(CliKind::Codex),
        _ => None,
    }
}

impl CliAgent {
    pub fn new(kind: CliKind) -> Self {
        CliAgent {
            kind,
            program: match kind {
                CliKind::Claude => "claude",
                CliKind::Codex => "codex",
                CliKind::Gemini => "gemini",
                CliKind::Grok => "grok",
                CliKind::Antigravity => "agy",
                CliKind::Plain => "",
            }
            .to_string(),
            interpreter: None,
            model: None,
            template: Vec::new(),
            prompt_on_stdin: false,
            prompt_file: None,
            auto_approve: false,
            endpoint: None,
            max_turns: None,
            extra_args: Vec::new(),
            stream: None,
        }
    }

    pub fn parser(&self) -> Box<dyn StreamParser> {
        match self.stream.unwrap_or(self.kind) {
            CliKind::Claude => Box::new(ClaudeParser::default()),
            CliKind::Codex => Box::new(CodexParser::default()),
            CliKind::Gemini => Box::new(GeminiParser::default()),
            CliKind::Grok | CliKind::Antigravity | CliKind::Plain => {
                Box::new(PlainParser::default())
            }
        }
    }

    /// The argv (program first), stdin and the env additions for one prompt.
    pub fn command(&self, prompt: &str) -> Result<CliCommand, AgentError> {
        if self.program.is_empty() {
            return Err(AgentError::Config(
                "the agent CLI has no program to run".into(),
            ));
        }
        let mut argv: Vec<String> = self
            .interpreter
            .iter()
            .cloned()
            .chain([self.program.clone()])
            .collect();
        let mut env = Vec::new();
        let stdin = self.prompt_on_stdin.then(|| prompt.to_string());
        // The prompt as an argument, unless it goes on stdin.
        let inline = stdin.is_none().then(|| prompt.to_string());
        match self.kind {
            CliKind::Claude => self.claude_args(inline, &mut argv, &mut env)?,
            CliKind::Codex => return self.codex_command(argv, env, stdin, inline),
            CliKind::Gemini => self.gemini_args(inline, &mut argv, &mut env)?,
            CliKind::Plain => return Ok(self.plain_command(prompt, argv, env, stdin)),
            CliKind::Grok | CliKind::Antigravity => {
                return self.prompt_file_command(prompt, argv, env);
            }
        }
        argv.extend(self.extra_args.iter().cloned());
        Ok(CliCommand {
            argv,
            stdin,
            env,
            prompt_file: None,
        })
    }

    /// The one dialect table ([`crate::spec::AgentKind::dialects`]), checked
    /// again where the command is built (a mode checks it before any work).
    fn check_dialect(&self, e: &Endpoint) -> Result<(), AgentError> {
        dialect_of(self.kind, e)
    }

    /// Claude Code's arguments and env additions after the program (the caller adds `extra_args`).
    fn claude_args(
        &self,
        inline: Option<String>,
        argv: &mut Vec<String>,
        env: &mut Vec<(String, String)>,
    ) -> Result<(), AgentError> {
        // `-p` (print mode) reads the prompt from stdin when none follows.
        argv.push("-p".into());
        argv.extend(inline);
        argv.extend(["--output-format", "stream-json", "--verbose"].map(String::from));
        if let Some(m) = &self.model {
            argv.extend(["--model".into(), m.clone()]);
        }
        if let Some(n) = self.max_turns {
            argv.extend(["--max-turns".into(), n.to_string()]);
        }
        if self.auto_approve {
            argv.push("--dangerously-skip-permissions".into());
            // Claude Code refuses that flag as root unless told it runs
            // in a sandbox, which is where belay runs agents.
            env.push(("IS_SANDBOX".into(), "1".into()));
        }
        if let Some(e) = &self.endpoint {
            self.check_dialect(e)?;
            endpoint_env(CliKind::Claude, e, env);
        }
        Ok(())
    }

    /// codex's whole command (`codex exec --json`), from the program and the env so far.
    fn codex_command(
        &self,
        mut argv: Vec<String>,
        mut env: Vec<(String, String)>,
        stdin: Option<String>,
        inline: Option<String>,
    ) -> Result<CliCommand, AgentError> {
        argv.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
        for a in CODEX_QUIET_ARGS {
            argv.push(a.to_string());
        }
        if self.auto_approve {
            argv.push("--dangerously-bypass-approvals-and-sandbox".into());
        } else {
            argv.extend(["--sandbox".into(), "workspace-write".into()]);
        }
        if let Some(m) = &self.model {
            argv.extend(["-m".into(), m.clone()]);
        }
        if let Some(e) = &self.endpoint {
            self.check_dialect(e)?;
            argv.extend(codex_provider_args(e, &mut env));
        }
        argv.extend(self.extra_args.iter().cloned());
        // codex reads the prompt from stdin when it is `-`.
        argv.push(inline.unwrap_or_else(|| "-".into()));
        Ok(CliCommand {
            argv,
            stdin,
            env,
            prompt_file: None,
        })
    }

    /// gemini's arguments and env additions after the program (the caller adds `extra_args`).
    fn gemini_args(
        &self,
        inline: Option<String>,
        argv: &mut Vec<String>,
        env: &mut Vec<(String, String)>,
    ) -> Result<(), AgentError> {
        // Without `-p`, gemini takes a piped prompt from stdin.
        if let Some(p) = inline {
            argv.extend(["-p".into(), p]);
        }
        argv.extend(["--output-format", "stream-json"].map(String::from));
        if let Some(m) = &self.model {
            argv.extend(["-m".into(), m.clone()]);
        }
        if self.auto_approve {
            argv.push("--yolo".into());
        }
        if let Some(e) = &self.endpoint {
            self.check_dialect(e)?;
            endpoint_env(CliKind::Gemini, e, env);
        }
        Ok(())
    }

    /// A plain command: the template filled in (the prompt on stdin without a `{prompt}` slot).
    fn plain_command(
        &self,
        prompt: &str,
        mut argv: Vec<String>,
        env: Vec<(String, String)>,
        stdin: Option<String>,
    ) -> CliCommand {
        let has_slot = self.template.iter().any(|a| a.contains("{prompt}"));
        for a in &self.template {
            let a = a.replace("{model}", self.model.as_deref().unwrap_or(""));
            argv.push(if stdin.is_none() {
                a.replace("{prompt}", prompt)
            } else {
                a.replace("{prompt}", "")
            });
        }
        argv.extend(self.extra_args.iter().cloned());
        let mut env = env;
        self.stream_endpoint(&mut argv, &mut env);
        let stdin = if has_slot {
            stdin
        } else {
            Some(prompt.to_string())
        };
        CliCommand {
            argv,
            stdin,
            env,
            prompt_file: None,
        }
    }

    /// A command whose stream is a known CLI's (a peer config's `claude …
    /// stream-json`) is wired to belay's endpoint as that CLI's own form
    /// is: its base URL and key variables (a dialect it does not speak gets
    /// none), and Claude Code told it runs in a sandbox when it is asked to
    /// skip permissions.
    fn stream_endpoint(&self, argv: &mut Vec<String>, env: &mut Vec<(String, String)>) {
        let Some(kind) = self.stream else { return };
        let skip = self
            .template
            .iter()
            .chain(&self.extra_args)
            .any(|a| a == "--dangerously-skip-permissions");
        if kind == CliKind::Claude && skip {
            env.push(("IS_SANDBOX".into(), "1".into()));
        }
        let Some(e) = &self.endpoint else { return };
        if dialect_of(kind, e).is_err() {
            return;
        }
        if kind == CliKind::Codex {
            // codex reads no base URL from its environment: its provider
            // goes after `exec`, as the spec form's does.
            if let Some(i) = argv.iter().position(|a| a == "exec") {
                let args = codex_provider_args(e, env);
                argv.splice(i + 1..i + 1, args);
            }
        } else {
            endpoint_env(kind, e, env);
        }
    }

    /// grok's or agy's command: the prompt goes to [`CliAgent::prompt_file`], named by `-p`.
    fn prompt_file_command(
        &self,
        prompt: &str,
        mut argv: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<CliCommand, AgentError> {
        // These take the prompt only after `-p`: it goes to a file,
        // and the argument only says where (argv is visible in `ps`
        // and capped at 128 KiB).
        let Some(path) = &self.prompt_file else {
            return Err(AgentError::Config(format!(
                "{} takes its prompt as an argument: the launcher must give it a prompt file",
                self.program
            )));
        };
        argv.extend([
            "-p".to_string(),
            format!("Your task is in the file {path}. Read that file and carry out the task it describes."),
        ]);
        if self.auto_approve {
            argv.push(
                match self.kind {
                    CliKind::Grok => "--always-approve",
                    _ => "--dangerously-skip-permissions",
                }
                .into(),
            );
        }
        if let Some(m) = &self.model {
            argv.extend(["--model".into(), m.clone()]);
        }
        argv.extend(self.extra_args.iter().cloned());
        Ok(CliCommand {
            argv,
            stdin: None,
            env,
            prompt_file: Some((path.clone(), prompt.to_string())),
        })
    }
}

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The host environment a CLI child starts from: only these variables (and
/// the proxy variables, `belay_sandbox::trust::PROXY_VARS`) pass
/// (everything else, secrets included, is scrubbed); callers add what the
/// agent needs.
pub const PASS_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "SHELL",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CODEX_HOME",
    "CLAUDE_CONFIG_DIR",
    "GEMINI_CLI_HOME",
];

pub fn scrubbed_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = PASS_ENV
        .iter()
        .chain(belay_sandbox::trust::PROXY_VARS.iter())
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    env.push(("TERM".into(), "dumb".into()));
    env.push(("NO_COLOR".into(), "1".into()));
    env.push(("CI".into(), "1".into()));
    env
}

/// A process to run.
#[derive(Debug, Clone)]
pub struct Launch {
    pub argv: Vec<String>,
    pub stdin: Option<String>,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Where the child's identity is kept while it runs, so that a later
    /// belay can kill its group if this one is killed (see [`kill_recorded`]).
    pub pid_file: Option<PathBuf>,
    pub process: ProcessOptions,
}

/// How a process is watched beyond belay's limits.
#[derive(Debug, Clone, Default)]
pub struct ProcessOptions {
    /// A raw copy of the process's stdout and stderr, merged by line and
    /// redacted as it is written (a round log).
    pub transcript: Option<(PathBuf, belay_record::Redactor)>,
    /// An output line holding this text counts as the final result: the
    /// process then has [`Limits::final_grace`] to exit before its group is
    /// killed (the peer's `terminal_marker`).
    pub final_marker: Option<String>,
    /// Tie the process's life to belay's: it is killed (SIGKILL) when belay
    /// dies, even by `kill -9` (see [`crate::lifeline`]).
    pub tie_to_parent: bool,
}

/// Kill the process group recorded in `pid_file` by a belay that was killed
/// itself (kill -9) while its agent ran, if that process is still the same
/// one (same pid, start time and boot), and remove the file. Whether a
/// group was killed.
pub fn kill_recorded(pid_file: &std::path::Path) -> bool {
    // host-owned: callers pass `agent.pid` in belay's own run or log dir (outside any work tree).
    let Ok(text) = fs_err::read_to_string(pid_file) else {
        return false;
    };
    let _ = fs_err::remove_file(pid_file);
    let Ok(id) = serde_json::from_str::<belay_record::ProcessIdentity>(&text) else {
        return false;
    };
    if !id.is_alive() {
        return false;
    }
    kill_group(Some(id.pid));
    true
}

impl Launch {
    /// A CLI agent's launch in `cwd`: scrubbed env, then the agent's additions.
    pub fn for_agent(
        agent: &CliAgent,
        prompt: &str,
        cwd: PathBuf,
        extra_env: &[(String, String)],
    ) -> Result<Self, AgentError> {
        let CliCommand {
            argv,
            stdin,
            env: add,
            prompt_file,
        } = agent.command(prompt)?;
        if let Some((path, text)) = prompt_file {
            write_private(std::path::Path::new(&path), text.as_bytes())?;
        }
        let mut env = scrubbed_env();
        for (k, v) in add.into_iter().chain(extra_env.iter().cloned()) {
            env.retain(|(x, _)| *x != k);
            env.push((k, v));
        }
        Ok(Launch {
            argv,
            stdin,
            env,
            cwd,
            pid_file: None,
            process: ProcessOptions::default(),
        })
    }
}

/// Write `bytes` to `path`, readable by its owner only.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> Result<(), AgentError> {
    use fs_err::os::unix::fs::OpenOptionsExt;
    use std::io::Write;
    let mut f = fs_err::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| AgentError::Io(e.to_string()))?;
    f.write_all(bytes)
        .map_err(|e| AgentError::Io(format!("cannot write {}: {e}", path.display())))
}

/// How long output is still read after the program exited (or was killed).
const EXIT_DRAIN: Duration = Duration::from_millis(200);

/// The longest line taken from a CLI; longer lines are cut (and reported).
pub const MAX_LINE: usize = 32 * 1024 * 1024;
const STDERR_KEEP: usize = 8 * 1024;

/// Read one line into `line` (bounded). Cancel-safe: bytes move from the
/// reader's buffer into `line` in one step. Returns false at end of stream.
async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
    cut: &mut bool,
    activity: &std::sync::atomic::AtomicU64,
) -> std::io::Result<bool> {
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(!line.is_empty());
        }
        activity.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, Some(i + 1)),
            None => (buf.len(), None),
        };
        let room = MAX_LINE.saturating_sub(line.len());
        if take > room {
            *cut = true;
        }
        line.extend_from_slice(&buf[..take.min(room)]);
        match done {
            Some(n) => {
                r.consume(n);
                return Ok(true);
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
}

/// The raw, redacted copy of a process's output.
struct Transcript {
    out: std::io::BufWriter<fs_err::File>,
    red: belay_record::StreamRedactor,
    buf: Vec<u8>,
}

impl Transcript {
    fn create(path: &std::path::Path, red: belay_record::Redactor) -> Result<Self, AgentError> {
        use fs_err::os::unix::fs::OpenOptionsExt;
        let f = fs_err::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| AgentError::Io(e.to_string()))?;
        Ok(Transcript {
            out: std::io::BufWriter::new(f),
            red: belay_record::StreamRedactor::new(red),
            buf: Vec::new(),
        })
    }

    /// Append `bytes` (a log that cannot be written loses lines, not the run).
    fn write(t: &std::sync::Mutex<Transcript>, bytes: &[u8]) {
        use std::io::Write;
        if let Ok(mut t) = t.lock() {
            let t = &mut *t;
            t.buf.clear();
            t.red.push(bytes, &mut t.buf);
            let _ = t.out.write_all(&t.buf);
        }
    }

    fn finish(t: &std::sync::Mutex<Transcript>) {
        use std::io::Write;
        if let Ok(mut t) = t.lock() {
            let t = &mut *t;
            t.buf.clear();
            t.red.finish(&mut t.buf);
            let _ = t.out.write_all(&t.buf);
            let _ = t.out.flush();
        }
    }
}

fn memchr_str(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Removes a file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs_err::remove_file(&self.0);
    }
}

/// Kills a process group when dropped.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Run a CLI to completion or to one of belay's limits. `on_event` sees every
/// event as it is parsed (to record the trajectory).
pub async fn run(
    launch: &Launch,
    parser: &mut dyn StreamParser,
    limits: &Limits,
    prices: Option<Prices>,
    on_event: &mut (dyn FnMut(&AgentEvent) + Send),
) -> Result<AgentReport, AgentError> {
    let t0 = Instant::now();
    let Some((program, args)) = launch.argv.split_first() else {
        return Err(AgentError::Config(
            "nothing to run: the argv is empty".into(),
        ));
    };
    let program = program.clone();
    let (exe, args) = exec_argv(launch, &program, args)?;
    let transcript = match &launch.process.transcript {
        Some((path, red)) => Some(std::sync::Arc::new(std::sync::Mutex::new(
            Transcript::create(path, red.clone())?,
        ))),
        None => None,
    };
    let mut child = spawn_child(launch, &exe, &args, &program)?;
    let pid = child.id();
    // Whatever ends this function (a return, a dropped future), the group dies.
    let _group = GroupGuard(pid);
    let _recorded = record_pid(launch, pid)?.map(RemoveOnDrop);
    let activity = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    write_stdin(launch, &mut child);
    let stderr_task = read_stderr(&mut child, activity.clone(), transcript.clone());
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| AgentError::Io("no stdout pipe".into()))?;
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);

    let mut w = Watch::new(limits);
    let cx = WatchCx {
        launch,
        limits,
        prices,
        program: &program,
        pid,
        activity: &activity,
        transcript: transcript.as_deref(),
    };
    w.watch(&mut child, &mut reader, cx, parser, on_event)
        .await?;

    let status = w.settle(&mut child, pid, limits).await;
    let exit_code = status.and_then(|s| s.code());
    if w.stop.is_none() {
        w.finish_stream(parser, exit_code, on_event);
    }
    // A stderr held open by a process that escaped the group is not waited for.
    let stderr_wait = if w.exited.is_some() || w.stop.is_some() || w.killed_after_result {
        EXIT_DRAIN
    } else {
        Duration::from_secs(2)
    };
    let stderr_tail = join_stderr(stderr_task, stderr_wait).await;
    if let Some(t) = &transcript {
        Transcript::finish(t);
    }

    let (stop, final_text, interim) = outcome(&w.tally, w.stop, exit_code);
    let cost = cost(&w.tally, prices);
    Ok(AgentReport {
        exit_code,
        killed_after_result: w.killed_after_result,
        stderr_tail,
        ..w.tally
            .report(final_text, stop, interim, cost, t0.elapsed().as_secs_f64())
    })
}

/// The executable and arguments to start: the program's, or belay's launcher (tied to belay).
fn exec_argv(
    launch: &Launch,
    program: &str,
    args: &[String],
) -> Result<(String, Vec<String>), AgentError> {
    // Tied to belay: the launcher is belay itself, which sets its parent-death
    // signal and then becomes the program (`exec`, no process of its own).
    if launch.process.tie_to_parent {
        let me = std::env::current_exe()
            .map_err(|e| AgentError::Io(format!("cannot find belay's own executable: {e}")))?;
        let mut a = vec![
            crate::lifeline::EXEC_ARG.to_string(),
            std::process::id().to_string(),
            "--".to_string(),
            program.to_string(),
        ];
        a.extend(args.iter().cloned());
        Ok((me.display().to_string(), a))
    } else {
        Ok((program.to_string(), args.to_vec()))
    }
}

/// Start `exe` in its own process group, with the launch's env and cwd and piped output.
fn spawn_child(
    launch: &Launch,
    exe: &str,
    args: &[String],
    program: &str,
) -> Result<tokio::process::Child, AgentError> {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.cwd)
        .process_group(0)
        .stdin(if launch.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd.spawn().map_err(|source| AgentError::Spawn {
        program: program.to_string(),
        source,
    })
}

/// Record the child's identity in the launch's pid file, if any: the file written.
fn record_pid(launch: &Launch, pid: Option<u32>) -> Result<Option<PathBuf>, AgentError> {
    match (
        &launch.pid_file,
        pid.and_then(belay_record::ProcessIdentity::of),
    ) {
        (Some(f), Some(id)) => {
            let text = serde_json::to_string(&id).map_err(|e| AgentError::Io(e.to_string()))?;
            belay_record::atomic_write(f, text.as_bytes())?;
            Ok(Some(f.clone()))
        }
        _ => Ok(None),
    }
}

/// Write the launch's stdin to the child in a task of its own, then close it.
fn write_stdin(launch: &Launch, child: &mut tokio::process::Child) {
    if let (Some(text), Some(mut stdin)) = (launch.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            let _ = stdin.write_all(text.as_bytes()).await;
            let _ = stdin.shutdown().await;
        });
    }
}

/// Read the child's stderr in a task (activity, transcript copy) that returns its tail.
fn read_stderr(
    child: &mut tokio::process::Child,
    stderr_activity: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stderr_transcript: Option<std::sync::Arc<std::sync::Mutex<Transcript>>>,
) -> Option<tokio::task::JoinHandle<String>> {
    child.stderr.take().map(|mut e| {
        tokio::spawn(async move {
            let mut keep: Vec<u8> = Vec::new();
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = e.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                stderr_activity.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(t) = &stderr_transcript {
                    Transcript::write(t, &buf[..n]);
                }
                keep.extend_from_slice(&buf[..n]);
                if keep.len() > 2 * STDERR_KEEP {
                    keep.drain(..keep.len() - STDERR_KEEP);
                }
            }
            let s = String::from_utf8_lossy(&keep[keep.len().saturating_sub(STDERR_KEEP)..])
                .into_owned();
            s
        })
    })
}

/// The stderr task's tail, waited for at most `wait` (empty without one).
async fn join_stderr(task: Option<tokio::task::JoinHandle<String>>, wait: Duration) -> String {
    match task {
        Some(t) => tokio::time::timeout(wait, t)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default(),
        None => String::new(),
    }
}

/// What [`Watch::watch`] reads besides the child: launch, limits and shared reader state.
#[derive(Clone, Copy)]
struct WatchCx<'a> {
    launch: &'a Launch,
    limits: &'a Limits,
    prices: Option<Prices>,
    program: &'a str,
    pid: Option<u32>,
    activity: &'a std::sync::atomic::AtomicU64,
    transcript: Option<&'a std::sync::Mutex<Transcript>>,
}

/// Where [`run`]'s watch over a child's output stands.
struct Watch {
    tally: Tally,
    stop: Option<StopReason>,
    line: Vec<u8>,
    cut: bool,
    events: Vec<AgentEvent>,
    wall_deadline: Option<tokio::time::Instant>,
    idle_deadline: Option<tokio::time::Instant>,
    grace_deadline: Option<tokio::time::Instant>,
    killed_after_result: bool,
    activity_seen: u64,
    /// The program's own exit: what it left running (a `sleep &` holding the
    /// pipe) gets the grace time to finish its output, then goes.
    exited: Option<std::process::ExitStatus>,
    drain_deadline: Option<tokio::time::Instant>,
}

impl Watch {
    /// A watch starting now, under `limits`.
    fn new(limits: &Limits) -> Self {
        Watch {
            tally: Tally::default(),
            stop: None,
            line: Vec::with_capacity(4096),
            cut: false,
            events: Vec::new(),
            wall_deadline: limits.wall_time.map(|w| tokio::time::Instant::now() + w),
            idle_deadline: limits.idle.map(|i| tokio::time::Instant::now() + i),
            grace_deadline: None,
            killed_after_result: false,
            activity_seen: 0,
            exited: None,
            drain_deadline: None,
        }
    }

    /// Read the child's output until it ends, a limit stops it, or a deadline passes.
    async fn watch(
        &mut self,
        child: &mut tokio::process::Child,
        reader: &mut BufReader<tokio::process::ChildStdout>,
        cx: WatchCx<'_>,
        parser: &mut dyn StreamParser,
        on_event: &mut (dyn FnMut(&AgentEvent) + Send),
    ) -> Result<(), AgentError> {
        let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
        let program = cx.program;
        loop {
            let deadline = [
                self.wall_deadline,
                self.idle_deadline,
                self.grace_deadline,
                self.drain_deadline,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(far);
            tokio::select! {
                st = child.wait(), if self.exited.is_none() => {
                    match st {
                        Ok(st) => self.exited = Some(st),
                        Err(e) => return Err(AgentError::Io(format!("cannot wait for {program}: {e}"))),
                    }
                    // What it wrote is in the pipe; what it left running is a
                    // leftover, killed now. A process that left the group and
                    // holds the pipe gets a moment, not the budget.
                    kill_group(cx.pid);
                    self.drain_deadline = Some(tokio::time::Instant::now() + EXIT_DRAIN);
                }
                r = next_line(&mut *reader, &mut self.line, &mut self.cut, cx.activity) => {
                    match r {
                        Ok(true) => {}
                        Ok(false) | Err(_) => break,
                    }
                    if self.take_line(cx, parser, on_event) {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    if !self.on_deadline(cx.limits, cx.activity) {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Take the line just read (transcript, deadlines, events): whether a limit stops the run.
    fn take_line(
        &mut self,
        cx: WatchCx<'_>,
        parser: &mut dyn StreamParser,
        on_event: &mut (dyn FnMut(&AgentEvent) + Send),
    ) -> bool {
        let limits = cx.limits;
        if let Some(t) = cx.transcript {
            self.line.push(b'\n');
            Transcript::write(t, &self.line);
            self.line.pop();
        }
        if self.grace_deadline.is_none() {
            if let Some(m) = &cx.launch.process.final_marker {
                if !m.is_empty() && memchr_str(&self.line, m.as_bytes()) {
                    self.grace_deadline = Some(tokio::time::Instant::now() + limits.final_grace);
                }
            }
        }
        if let Some(i) = limits.idle {
            self.idle_deadline = Some(tokio::time::Instant::now() + i);
        }
        self.activity_seen = cx.activity.load(std::sync::atomic::Ordering::Relaxed);
        if self.cut {
            self.events.push(AgentEvent::Error {
                message: format!("an output line longer than {MAX_LINE} bytes was cut"),
                fatal: false,
            });
            self.cut = false;
        }
        if !self.line.iter().all(u8::is_ascii_whitespace) {
            parser.line(&self.line, &mut self.events);
        }
        self.line.clear();
        for ev in self.events.drain(..) {
            self.tally.take(&ev);
            on_event(&ev);
            if matches!(ev, AgentEvent::Final { .. }) && self.grace_deadline.is_none() {
                self.grace_deadline = Some(tokio::time::Instant::now() + limits.final_grace);
            }
        }
        if let Some(max) = limits.max_turns {
            if self.tally.turns > max {
                self.stop = Some(StopReason::TurnLimit { limit: max });
            }
        }
        if let Some(max) = limits.max_cost_usd {
            if cost(&self.tally, cx.prices) > max {
                self.stop = Some(StopReason::CostLimit { limit_usd: max });
            }
        }
        self.stop.is_some()
    }

    /// A deadline passed: true to watch on (output moved, not by line), false to end the watch.
    fn on_deadline(&mut self, limits: &Limits, activity: &std::sync::atomic::AtomicU64) -> bool {
        let now = tokio::time::Instant::now();
        // Output without a newline (progress bars) or on stderr is not idleness.
        let seen = activity.load(std::sync::atomic::Ordering::Relaxed);
        let idle_due = self.idle_deadline.is_some_and(|d| now >= d)
            && self.grace_deadline.is_none_or(|g| now < g)
            && self.wall_deadline.is_none_or(|w| now < w);
        if idle_due && seen != self.activity_seen {
            self.activity_seen = seen;
            self.idle_deadline = limits.idle.map(|i| now + i);
            return true;
        }
        if self.drain_deadline.is_some_and(|d| now >= d) {
            // Exited; what holds its output open is a leftover.
        } else if self.grace_deadline.is_some_and(|g| now >= g) {
            self.killed_after_result = true;
        } else if self.wall_deadline.is_some_and(|w| now >= w) {
            self.stop = Some(StopReason::WallTime {
                limit_s: limits.wall_time.map(|d| d.as_secs_f64()).unwrap_or(0.0),
            });
        } else {
            self.stop = Some(StopReason::Idle {
                limit_s: limits.idle.map(|d| d.as_secs_f64()).unwrap_or(0.0),
            });
        }
        false
    }

    /// The child's exit status after the watch, killing its group as the ending requires.
    async fn settle(
        &mut self,
        child: &mut tokio::process::Child,
        pid: Option<u32>,
        limits: &Limits,
    ) -> Option<std::process::ExitStatus> {
        // Stopped by a limit, or hanging after its result: kill the whole group.
        if let Some(st) = self.exited {
            kill_group(pid); // what it left running
            Some(st)
        } else if self.stop.is_some() || self.killed_after_result {
            kill_group(pid);
            tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            // End of output: the process should exit now; it gets the grace time
            // (its children may hold the pipe or linger).
            match tokio::time::timeout(limits.final_grace, child.wait()).await {
                Ok(s) => {
                    kill_group(pid); // leftover grandchildren
                    s.ok()
                }
                Err(_) => {
                    if self.tally.final_event.is_some() {
                        self.killed_after_result = true;
                    }
                    kill_group(pid);
                    tokio::time::timeout(Duration::from_secs(10), child.wait())
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
            }
        }
    }

    /// End of stream: the parser's last events, tallied and passed on.
    fn finish_stream(
        &mut self,
        parser: &mut dyn StreamParser,
        exit_code: Option<i32>,
        on_event: &mut (dyn FnMut(&AgentEvent) + Send),
    ) {
        parser.finish(&mut self.events, exit_code);
        for ev in self.events.drain(..) {
            self.tally.take(&ev);
            on_event(&ev);
        }
    }
}

/// Why the run stopped, its final text, and whether that text is an interim report.
fn outcome(
    tally: &Tally,
    stop: Option<StopReason>,
    exit_code: Option<i32>,
) -> (StopReason, String, bool) {
    match stop {
        Some(s) => {
            let why = s.describe();
            (s, tally.interim_report(&why), true)
        }
        None => match &tally.final_event {
            Some((text, false, _)) if tally.fatal_error.is_none() => {
                (StopReason::Completed, text.clone(), false)
            }
            Some((text, _, sub)) => {
                // The CLI's own words first (Claude Code's "Not logged in"
                // is its result text, under the subtype "success").
                let said = Some(text.trim()).filter(|t| !t.is_empty()).map(one_line);
                let message = tally
                    .fatal_error
                    .clone()
                    .or(said)
                    .or_else(|| sub.clone().filter(|s| s != "success"))
                    .unwrap_or_else(|| "the agent reported an error".into());
                (StopReason::Failed { message }, text.clone(), false)
            }
            None => {
                let message = match exit_code {
                    Some(c) => format!("exited with code {c} without a final result"),
                    None => "ended without a final result".into(),
                };
                let message = match &tally.fatal_error {
                    Some(e) => format!("{message}: {e}"),
                    None => message,
                };
                let text = tally.interim_report(&message);
                (StopReason::Failed { message }, text, true)
            }
        },
    }
}

/// A CLI's error text as one line of at most 300 characters.
fn one_line(t: &str) -> String {
    let line = t.split_whitespace().collect::<Vec<_>>().join(" ");
    line.chars().take(300).collect()
}

/// Cost: what belay computes from the tokens, or what the CLI reported if more.
fn cost(t: &Tally, prices: Option<Prices>) -> f64 {
    let computed = prices.map(|p| p.cost(&t.total_usage())).unwrap_or(0.0);
    computed.max(t.reported_cost.unwrap_or(0.0))
}
