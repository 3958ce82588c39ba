//! The pipeline file (FORMATS.md §4): types, loading and validation.
//!
//! Syntax and type errors come from the YAML parser with their line and
//! column; the checks after parsing (exactly one of agent/command/action,
//! routing targets, declared secrets, agent files...) carry the location of
//! the step or field they are about. Every error reads `file:line:col: what`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

/// A loading error, located.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{}:{line}:{column}: {message}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl belay_record::Classify for LoadError {
    fn exit_class(&self) -> belay_record::ExitClass {
        belay_record::ExitClass::Usage
    }

    fn error_code(&self) -> &'static str {
        "BELAY-E101"
    }
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    pub model: String,
    #[serde(default)]
    pub base_url: Option<String>,
    /// The variable that holds the key (default OPENAI_API_KEY).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Seconds for a whole model call (default: none).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// responses (default), chat-completions or anthropic.
    #[serde(default)]
    pub api: Option<belay_model::Api>,
    /// Scrub the run's secrets from everything the built-in agent sends to
    /// the model (tool results, the task). Default: on.
    #[serde(default = "yes")]
    pub scrub_requests: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub from: String,
    pub key: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Isolation {
    /// Image of every step's container (an image from `belay env build` works).
    #[serde(default)]
    pub image: Option<String>,
    /// Memory cap, e.g. `2g`, `512m`; `0` for none. Default: 8 GiB, or
    /// three quarters of the machine's memory when that is less.
    #[serde(default)]
    pub memory: Option<String>,
    /// Process cap of each step container; `0` for none. Default 4096.
    #[serde(default)]
    pub pids: Option<i64>,
    /// Cap of each step log, e.g. `64m` (the default); `0` for none. Output
    /// past it is counted and dropped, and the log ends with a marker.
    #[serde(default)]
    pub log_limit: Option<String>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub allow_git_mutations: bool,
    #[serde(default)]
    pub seccomp_profile: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DepsPolicy {
    #[default]
    Locked,
    Open,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Cache {
    /// Where the cache is in the container: an absolute path, or a path
    /// relative to the workspace (agentic-dev-loop's form, e.g.
    /// `qa/node_modules`), which is then never committed.
    pub path: String,
    /// Name of the host directory under `<state_dir>/caches/` (default: from the path).
    #[serde(default)]
    pub name: Option<String>,
}

impl Cache {
    /// The path relative to the workspace, for a cache inside it.
    pub fn in_workspace(&self) -> Option<&str> {
        (!self.path.starts_with('/')).then(|| self.path.trim_end_matches('/'))
    }
}

/// A cache as written: `{path, name}`, or just the path (agentic-dev-loop).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum RawCache {
    Path(String),
    Full(Cache),
}

/// The egress of networked steps: none of it (the run's fenced bridge), the
/// `package-registries` preset through the allowlisting proxy, or the
/// browser class (every public host on 80/443 through the proxy, logged).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    #[serde(default)]
    pub presets: Vec<String>,
    #[serde(default)]
    pub class: Option<EgressClass>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum EgressClass {
    /// Broad but logged: any public address on ports 80 and 443.
    Browser,
}

/// What a networked step can reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpenNet {
    /// The run's bridge: the internet, the host fenced off.
    Bridge,
    /// Only the package registries, through the proxy.
    Registries,
    /// Any public host on 80/443, through the proxy, every connection logged.
    Browser,
}

impl Egress {
    pub fn kind(&self) -> OpenNet {
        if self.class == Some(EgressClass::Browser) {
            OpenNet::Browser
        } else if self.presets.is_empty() {
            OpenNet::Bridge
        } else {
            OpenNet::Registries
        }
    }

    pub fn describe(&self) -> &'static str {
        match self.kind() {
            OpenNet::Bridge => "bridge (the host fenced off)",
            OpenNet::Registries => {
                "internal, out only through the egress proxy (package registries)"
            }
            OpenNet::Browser => {
                "internal, out through the egress proxy to any public host on 80/443, every connection logged (class browser)"
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Verdicts {
    pub pass: String,
    pub fail: String,
    #[serde(default)]
    pub unverifiable: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    #[default]
    Rw,
    Ro,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Mounts {
    /// The workspace: rw (default for agent and command steps) or ro.
    #[serde(default)]
    pub workspace: Option<Access>,
}

/// Where a route goes.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Target {
    /// A step name, `success` or `failure`.
    Name(String),
    /// Go to a step; `retry: true` consumes an attempt.
    Goto {
        goto: String,
        #[serde(default)]
        retry: bool,
    },
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn items(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    pub name: String,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub produces: Option<OneOrMany>,
    #[serde(default)]
    pub artifact: Option<String>,
    #[serde(default)]
    pub verdicts: Option<Verdicts>,
    #[serde(default)]
    pub max_iterations: Option<u32>,
    /// Seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub setup: Option<String>,
    #[serde(default)]
    pub network: bool,
    #[serde(default)]
    pub mounts: Option<Mounts>,
    #[serde(default)]
    pub secrets: Vec<Spanned<String>>,
    #[serde(default)]
    pub on_pass: Option<Spanned<Target>>,
    #[serde(default)]
    pub on_fail: Option<Spanned<Target>>,
    #[serde(default)]
    pub on_unverifiable: Option<Spanned<Target>>,
    /// This step's egress (agentic-dev-loop puts it on the step); the
    /// pipeline's `egress` otherwise.
    #[serde(default)]
    pub egress: Option<Spanned<Egress>>,
    /// Give the step's secrets to its `setup:` too (default: setup runs
    /// with the network and without secrets).
    #[serde(default)]
    pub setup_secrets: bool,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawPipeline {
    pub name: String,
    #[serde(default)]
    pub additional_files: Vec<String>,
    #[serde(default)]
    pub llm: Option<LlmConfig>,
    #[serde(default)]
    pub max_attempts: Option<u32>,
    #[serde(default)]
    pub agents_dir: Option<String>,
    pub steps: Vec<Spanned<RawStep>>,
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretRef>,
    #[serde(default)]
    pub isolation: Isolation,
    #[serde(default)]
    pub state_dir: Option<String>,
    #[serde(default)]
    pub deps_policy: DepsPolicy,
    #[serde(default)]
    pub lockfiles: Vec<String>,
    #[serde(default)]
    pub caches: Vec<Spanned<RawCache>>,
    #[serde(default)]
    pub sync_excludes: Vec<String>,
    #[serde(default)]
    pub egress: Option<Egress>,
    /// agentic-dev-loop's Python extensions: refused with the mapping.
    #[serde(default)]
    pub extensions: Option<Spanned<serde_json::Value>>,
    #[serde(default)]
    pub extensions_dir: Option<Spanned<serde_json::Value>>,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StepKind {
    Agent {
        agent: String,
    },
    Command {
        command: String,
    },
    /// The built-in `commit` (host side) or a script run in the sandbox.
    Action {
        action: String,
    },
}

/// A resolved route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "to", rename_all = "lowercase")]
pub enum Route {
    Success,
    Failure,
    Step { step: String, retry: bool },
}

impl Route {
    pub fn describe(&self) -> String {
        match self {
            Route::Success => "success".into(),
            Route::Failure => "failure".into(),
            Route::Step { step, retry: true } => format!("{step} (retry)"),
            Route::Step { step, retry: false } => step.clone(),
        }
    }
}

/// An agent definition: `<agents_dir>/<name>.agent.md`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentDef {
    pub name: String,
    pub tools: Vec<String>,
    /// The agent spec (`builtin`, the default; `codex`, `claude`, `gemini`, or
    /// `cmd:PROGRAM ARG…`; each optionally `@MODEL`).
    pub runner: String,
    pub model: Option<String>,
    pub prompt: String,
    pub path: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FrontMatter {
    name: String,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    runner: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

/// A validated step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub name: String,
    #[serde(flatten)]
    pub kind: StepKind,
    pub params: BTreeMap<String, serde_json::Value>,
    pub produces: Vec<String>,
    pub artifact: Option<String>,
    pub verdicts: Option<Verdicts>,
    pub max_iterations: Option<u32>,
    pub timeout_s: Option<u64>,
    pub env: BTreeMap<String, String>,
    pub setup: Option<String>,
    /// Whether `setup:` gets the step's secrets.
    pub setup_secrets: bool,
    pub network: bool,
    /// What a networked step reaches (the step's `egress`, else the pipeline's).
    pub egress: Egress,
    pub workspace: Access,
    pub secrets: Vec<String>,
    pub on_pass: Route,
    pub on_fail: Route,
    pub on_unverifiable: Route,
    pub line: u64,
}

/// A validated pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct Pipeline {
    pub name: String,
    pub path: PathBuf,
    /// The directory the pipeline file is in: the workspace's git work tree.
    pub dir: PathBuf,
    pub additional_files: Vec<String>,
    pub llm: Option<LlmConfig>,
    pub max_attempts: u32,
    pub agents_dir: Option<String>,
    pub steps: Vec<Step>,
    pub secrets: BTreeMap<String, SecretRef>,
    pub isolation: Isolation,
    pub state_dir: Option<String>,
    pub deps_policy: DepsPolicy,
    pub lockfiles: Vec<String>,
    pub caches: Vec<Cache>,
    pub sync_excludes: Vec<String>,
    pub egress: Egress,
    pub agents: BTreeMap<String, AgentDef>,
    /// The provider prefix `llm.model` had (`openai/…`), which chose the dialect.
    pub llm_provider: Option<String>,
}

pub const EGRESS_PRESETS: &[&str] = &["package-registries"];

impl Pipeline {
    pub fn step(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name == name)
    }
}

/// Parse `pipeline.yaml`, the agent files it names, and check both.
pub fn load(path: &Path) -> Result<Pipeline, LoadError> {
    let err = |line: u64, column: u64, message: String| LoadError {
        path: path.to_path_buf(),
        line,
        column,
        message,
    };
    let text = read_tooling_text(path)
        .map_err(|e| err(0, 0, format!("cannot read the pipeline file: {e}")))?;
    parse(&text, path)
}

/// The most belay reads of a pipeline or agent file.
pub(crate) const TOOLING_MAX: u64 = 4 << 20;

/// Why a tooling file could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolingReadError {
    #[error("{} names no file", .0.display())]
    NoFile(PathBuf),
    #[error("cannot resolve {}: {source}", path.display())]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    HostFs(#[from] belay_sandbox::hostfs::HostFsError),
    #[error("{} does not exist", .0.display())]
    Missing(PathBuf),
    #[error("{} is larger than 4 MiB", .0.display())]
    TooLarge(PathBuf),
    #[error("{} is not UTF-8 text", .0.display())]
    NotUtf8(PathBuf),
}

/// A tooling file (the pipeline file, an agent file). It lives in the work
/// tree, which steps write (a previous run's step may have left it changed),
/// and is checked against HEAD only after it is read: so its directory is
/// resolved as the user named it, but its own name is never followed through
/// a link, only a regular file is read (opened non-blocking: a FIFO is
/// refused, never waited on), and at most [`TOOLING_MAX`] bytes.
pub(crate) fn read_tooling(path: &Path) -> Result<Vec<u8>, ToolingReadError> {
    let name = path
        .file_name()
        .ok_or_else(|| ToolingReadError::NoFile(path.to_path_buf()))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).map_err(|source| ToolingReadError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let bytes = belay_sandbox::hostfs::read_under(&dir, &dir.join(name), TOOLING_MAX + 1)?
        .ok_or_else(|| ToolingReadError::Missing(path.to_path_buf()))?;
    if bytes.len() as u64 > TOOLING_MAX {
        return Err(ToolingReadError::TooLarge(path.to_path_buf()));
    }
    Ok(bytes)
}

/// [`read_tooling`], as UTF-8 text.
fn read_tooling_text(path: &Path) -> Result<String, ToolingReadError> {
    String::from_utf8(read_tooling(path)?)
        .map_err(|_| ToolingReadError::NotUtf8(path.to_path_buf()))
}

/// Where `key:` is first written in the text (1-based line and column of the
/// key), or (1, 1): for the fields whose values carry no span.
pub(crate) fn key_location(text: &str, key: &str) -> (u64, u64) {
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let t = t.strip_prefix("- ").unwrap_or(t);
        if t.strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with(':'))
        {
            let col = line.len() - line.trim_start().len() + 1;
            return (i as u64 + 1, col as u64);
        }
    }
    (1, 1)
}

fn location_of(message: &str) -> (u64, u64) {
    // serde-saphyr writes "... at line L, column C" (or "line L column C").
    let grab = |key: &str| -> Option<u64> {
        let i = message.rfind(key)?;
        let rest = &message[i + key.len()..];
        let digits: String = rest
            .trim_start_matches([' ', ':'])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    (grab("line").unwrap_or(1), grab("column").unwrap_or(1))
}

/// A [`LoadError`] at `line:column` of the pipeline file `path`.
fn located(path: &Path, line: u64, column: u64, message: String) -> LoadError {
    LoadError {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

/// Parse and validate pipeline text (`path` names it in errors and anchors
/// relative paths).
pub fn parse(text: &str, path: &Path) -> Result<Pipeline, LoadError> {
    let err = |line: u64, column: u64, message: String| located(path, line, column, message);
    let raw: RawPipeline = serde_saphyr::from_str(text).map_err(|e| {
        let m = e.to_string();
        let (l, c) = location_of(&m);
        err(l, c, m)
    })?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    if raw.steps.is_empty() {
        return Err(err(
            1,
            1,
            "`steps` is empty: a pipeline needs at least one step".into(),
        ));
    }
    let names: Vec<&str> = raw.steps.iter().map(|s| s.value.name.as_str()).collect();
    check_step_names(path, &raw.steps, &names)?;
    let max_attempts = raw.max_attempts.unwrap_or(3);
    if max_attempts == 0 {
        return Err(err(1, 1, "`max_attempts` must be at least 1".into()));
    }
    refuse_extensions(path, &raw)?;
    let pipeline_egress = raw.egress.clone().unwrap_or_default();
    let (el, ec) = key_location(text, "egress");
    check_egress(path, &pipeline_egress, el, ec)?;
    let caches = resolve_caches(path, &raw.caches)?;
    check_seccomp(path, text, &dir, &raw.isolation)?;
    let (llm, llm_provider) = resolve_llm(path, text, &raw.llm)?;
    check_secret_providers(path, &raw.secrets)?;
    let ctx = StepCtx {
        path,
        names: &names,
        secrets: &raw.secrets,
        egress: &pipeline_egress,
    };
    let mut steps = Vec::new();
    let mut agent_names = Vec::new();
    for (i, s) in raw.steps.iter().enumerate() {
        steps.push(ctx.step(i, s, &mut agent_names)?);
    }
    if raw.deps_policy == DepsPolicy::Locked
        && raw.lockfiles.is_empty()
        && raw.steps.iter().any(|s| s.value.agent.is_some())
    {
        return Err(err(
            1,
            1,
            "`deps_policy: locked` (the default) needs `lockfiles` naming the lockfiles agents must respect; or set `deps_policy: open`".into(),
        ));
    }
    // Agent files.
    let agents = load_agents(path, &dir, &raw, &agent_names)?;
    check_agent_dialects(path, &raw, &agents, llm.as_ref())?;
    Ok(Pipeline {
        name: raw.name,
        path: path.to_path_buf(),
        dir,
        additional_files: raw.additional_files,
        llm,
        max_attempts,
        agents_dir: raw.agents_dir,
        steps,
        secrets: raw.secrets,
        isolation: raw.isolation,
        state_dir: raw.state_dir,
        deps_policy: raw.deps_policy,
        lockfiles: raw.lockfiles,
        caches,
        sync_excludes: raw.sync_excludes,
        egress: pipeline_egress,
        agents,
        llm_provider,
    })
}

/// Refuse an empty, reserved or repeated step name.
fn check_step_names(
    path: &Path,
    steps: &[Spanned<RawStep>],
    names: &[&str],
) -> Result<(), LoadError> {
    for (i, s) in steps.iter().enumerate() {
        let loc = &s.referenced;
        let (l, c) = (loc.line(), loc.column());
        let name = &s.value.name;
        if name.is_empty() || matches!(name.as_str(), "success" | "failure") {
            return Err(located(
                path,
                l,
                c,
                format!("step name `{name}` is reserved or empty"),
            ));
        }
        if names[..i].contains(&name.as_str()) {
            return Err(located(
                path,
                l,
                c,
                format!("step `{name}` is defined twice"),
            ));
        }
    }
    Ok(())
}

/// Refuse agentic-dev-loop's `extensions` / `extensions_dir`, with the mapping.
fn refuse_extensions(path: &Path, raw: &RawPipeline) -> Result<(), LoadError> {
    if let Some(x) = raw.extensions.as_ref().or(raw.extensions_dir.as_ref()) {
        let key = if raw.extensions.is_some() {
            "extensions"
        } else {
            "extensions_dir"
        };
        return Err(located(
            path,
            x.referenced.line(),
            x.referenced.column(),
            format!("`{key}` is agentic-dev-loop's Python plugin hook; belay runs no Python in the host and has no plugins. Map each use instead: a document loader (the AI-DLC one too) becomes `additional_files: [the documents]`; a consumer action becomes a step `action: NAME` with `params: {{script: \"...\"}}` (it runs in the sandbox); a tool becomes an agent CLI (`runner:` in the agent file). Then remove `{key}`. `belay run --explain-compat FILE` shows how every key maps"),
        ));
    }
    Ok(())
}

/// Check an `egress` (known presets; not both a class and presets), located at `l:c`.
fn check_egress(path: &Path, e: &Egress, l: u64, c: u64) -> Result<(), LoadError> {
    for p in &e.presets {
        if !EGRESS_PRESETS.contains(&p.as_str()) {
            return Err(located(
                path,
                l,
                c,
                format!(
                    "unknown egress preset `{p}`: known presets are {}",
                    EGRESS_PRESETS.join(", ")
                ),
            ));
        }
    }
    if e.class.is_some() && !e.presets.is_empty() {
        return Err(located(path, l, c, "`egress` gives both `class: browser` (any public host) and `presets`; give one: the class already allows what the presets would".into()));
    }
    Ok(())
}

/// The caches as written, checked: plain names, workspace paths inside it.
fn resolve_caches(path: &Path, raw: &[Spanned<RawCache>]) -> Result<Vec<Cache>, LoadError> {
    let mut caches = Vec::new();
    for c in raw {
        let cache = match &c.value {
            RawCache::Path(path) => Cache {
                path: path.clone(),
                name: None,
            },
            RawCache::Full(c) => c.clone(),
        };
        if let Some(name) = &cache.name {
            let plain = !name.is_empty()
                && !name.starts_with('.')
                && name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch));
            if !plain {
                return Err(located(path, c.referenced.line(), c.referenced.column(), format!("cache name `{name}`: a plain name (letters, digits, `-`, `_`, `.`; not starting with `.`), the directory under <state_dir>/caches/")));
            }
        }
        if let Some(rel) = cache.in_workspace() {
            let bad = rel.is_empty()
                || Path::new(rel)
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
                || rel.eq_ignore_ascii_case(".git")
                || rel.to_ascii_lowercase().starts_with(".git/");
            if bad {
                return Err(located(path, c.referenced.line(), c.referenced.column(), format!("cache `{}`: a workspace cache is a plain relative path inside the workspace (no `..`, not `.git`), or give an absolute path in the container", cache.path)));
            }
        }
        caches.push(cache);
    }
    Ok(caches)
}

/// Check `isolation.seccomp_profile`: it parses, and a file profile exists under `dir`.
fn check_seccomp(
    path: &Path,
    text: &str,
    dir: &Path,
    isolation: &Isolation,
) -> Result<(), LoadError> {
    let err = |line: u64, column: u64, message: String| located(path, line, column, message);
    if let Some(sc) = &isolation.seccomp_profile {
        let (l, c) = key_location(text, "seccomp_profile");
        match belay_sandbox::seccomp::parse(sc) {
            Err(m) => return Err(err(l, c, format!("isolation.seccomp_profile: {m}"))),
            Ok(belay_sandbox::seccomp::ProfileRef::File(f)) => {
                if !dir.join(f).is_file() {
                    return Err(err(l, c, format!("isolation.seccomp_profile: {} is not a file. Give a seccomp JSON profile relative to the pipeline file, or a bundled one ({})", dir.join(f).display(),
                        belay_sandbox::seccomp::BUNDLED.iter().map(|(n, _)| format!("bundled:{n}")).collect::<Vec<_>>().join(", "))));
                }
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// The `llm` section with a `provider/` prefix of its model resolved, and that prefix.
fn resolve_llm(
    path: &Path,
    text: &str,
    raw: &Option<LlmConfig>,
) -> Result<(Option<LlmConfig>, Option<String>), LoadError> {
    let err = |line: u64, column: u64, message: String| located(path, line, column, message);
    let mut llm = raw.clone();
    let mut llm_provider = None;
    if let Some(l) = llm.as_mut() {
        if l.api.is_none() {
            if let Some((prov, model)) = belay_model::provider::split(&l.model) {
                if !prov.has_default_endpoint && l.base_url.is_none() {
                    let (ll, lc) = key_location(text, "model");
                    return Err(err(ll, lc, format!("llm.model `{}`: provider `{}/` has no endpoint belay knows; give `llm.base_url` (its OpenAI-compatible URL)", l.model, prov.prefix)));
                }
                llm_provider = Some(prov.prefix.to_string());
                l.api = Some(prov.api);
                l.model = model.to_string();
            }
        }
        if l.api_key_env.as_deref() == Some("") {
            let (ll, lc) = key_location(text, "api_key_env");
            return Err(err(ll, lc, "llm.api_key_env is empty: name the environment variable that holds the key, or leave it out for a server that needs none".into()));
        }
    }
    Ok((llm, llm_provider))
}

/// Refuse a declared secret whose provider is not `env`.
fn check_secret_providers(
    path: &Path,
    secrets: &BTreeMap<String, SecretRef>,
) -> Result<(), LoadError> {
    for (name, s) in secrets {
        if s.from != "env" {
            return Err(located(
                path,
                1,
                1,
                format!(
                    "secret `{name}`: unknown provider `{}` (only `env` is known)",
                    s.from
                ),
            ));
        }
    }
    Ok(())
}

/// What validating each step needs from the pipeline around it.
struct StepCtx<'a> {
    path: &'a Path,
    /// Every step's name, in order.
    names: &'a [&'a str],
    /// The pipeline's declared secrets.
    secrets: &'a BTreeMap<String, SecretRef>,
    /// The pipeline's egress (a step's default).
    egress: &'a Egress,
}

impl StepCtx<'_> {
    /// A [`LoadError`] at `line:column` of the pipeline file.
    fn err(&self, line: u64, column: u64, message: String) -> LoadError {
        located(self.path, line, column, message)
    }

    /// Resolve a route as written, or `default` when there is none.
    fn route(&self, t: &Option<Spanned<Target>>, default: Route) -> Result<Route, LoadError> {
        let Some(t) = t else { return Ok(default) };
        let (l, c) = (t.referenced.line(), t.referenced.column());
        let (to, retry) = match &t.value {
            Target::Name(n) => (n.as_str(), false),
            Target::Goto { goto, retry } => (goto.as_str(), *retry),
        };
        match to {
            "success" if !retry => Ok(Route::Success),
            "failure" if !retry => Ok(Route::Failure),
            n if self.names.contains(&n) => Ok(Route::Step {
                step: n.to_string(),
                retry,
            }),
            n => Err(self.err(
                l,
                c,
                format!(
                    "routes to `{n}`, which is not a step (steps: {}; or success, failure)",
                    self.names.join(", ")
                ),
            )),
        }
    }

    /// What step `r` (at `l:c`) does: exactly one of agent, command and action.
    fn kind(&self, r: &RawStep, l: u64, c: u64) -> Result<StepKind, LoadError> {
        let kind = match (&r.agent, &r.command, &r.action) {
            (Some(a), None, None) => StepKind::Agent { agent: a.clone() },
            (None, Some(c), None) => StepKind::Command { command: c.clone() },
            (None, None, Some(a)) => StepKind::Action { action: a.clone() },
            _ => {
                return Err(self.err(
                    l,
                    c,
                    format!(
                        "step `{}` needs exactly one of `agent`, `command` and `action`",
                        r.name
                    ),
                ))
            }
        };
        if let StepKind::Action { action } = &kind {
            if action == "commit" {
                if r.network {
                    return Err(self.err(l, c, format!("step `{}`: the commit action runs on the host and never takes `network`", r.name)));
                }
            } else if !r.params.get("script").is_some_and(|v| v.is_string()) {
                return Err(self.err(l, c, format!("step `{}`: action `{action}` is not built in; give its script as `params.script` (it runs in the sandbox)", r.name)));
            }
        }
        Ok(kind)
    }

    /// Refuse `artifact` without `verdicts` and the reverse, and undeclared secrets.
    fn check_outputs_and_secrets(&self, r: &RawStep, l: u64, c: u64) -> Result<(), LoadError> {
        match (&r.artifact, &r.verdicts) {
            (Some(_), None) => {
                return Err(self.err(
                    l,
                    c,
                    format!(
                        "step `{}`: `artifact` needs `verdicts` (pass, fail)",
                        r.name
                    ),
                ))
            }
            (None, Some(_)) => {
                return Err(self.err(
                    l,
                    c,
                    format!("step `{}`: `verdicts` need an `artifact` to read", r.name),
                ))
            }
            _ => {}
        }
        for sec in &r.secrets {
            if !self.secrets.contains_key(&sec.value) {
                return Err(self.err(
                    sec.referenced.line(),
                    sec.referenced.column(),
                    format!(
                        "step `{}` lists secret `{}`, which `secrets` does not declare",
                        r.name, sec.value
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The step's own egress (checked; only on a networked step), else the pipeline's.
    fn step_egress(&self, r: &RawStep) -> Result<Egress, LoadError> {
        Ok(match &r.egress {
            Some(e) => {
                let (el, ec) = (e.referenced.line(), e.referenced.column());
                check_egress(self.path, &e.value, el, ec)?;
                if !r.network {
                    return Err(self.err(el, ec, format!("step `{}` gives `egress` without `network: true`: egress only applies to a networked step. Add `network: true`, or remove `egress`", r.name)));
                }
                e.value.clone()
            }
            None => self.egress.clone(),
        })
    }

    /// Validate step `i`, adding the agent it names (once) to `agent_names`.
    fn step(
        &self,
        i: usize,
        s: &Spanned<RawStep>,
        agent_names: &mut Vec<String>,
    ) -> Result<Step, LoadError> {
        let (l, c) = (s.referenced.line(), s.referenced.column());
        let r = &s.value;
        let kind = self.kind(r, l, c)?;
        if let StepKind::Agent { agent } = &kind {
            if !agent_names.contains(agent) {
                agent_names.push(agent.clone());
            }
        }
        self.check_outputs_and_secrets(r, l, c)?;
        let next = self
            .names
            .get(i + 1)
            .map(|n| Route::Step {
                step: n.to_string(),
                retry: false,
            })
            .unwrap_or(Route::Success);
        let on_fail = self.route(&r.on_fail, Route::Failure)?;
        Ok(Step {
            name: r.name.clone(),
            kind,
            params: r.params.clone(),
            produces: r
                .produces
                .as_ref()
                .map(OneOrMany::items)
                .unwrap_or_default(),
            artifact: r.artifact.clone(),
            verdicts: r.verdicts.clone(),
            max_iterations: r.max_iterations,
            timeout_s: r.timeout,
            env: r.env.clone(),
            setup: r.setup.clone(),
            setup_secrets: r.setup_secrets,
            network: r.network,
            egress: self.step_egress(r)?,
            workspace: r
                .mounts
                .as_ref()
                .and_then(|m| m.workspace)
                .unwrap_or_default(),
            secrets: r.secrets.iter().map(|s| s.value.clone()).collect(),
            on_pass: self.route(&r.on_pass, next)?,
            on_unverifiable: self.route(&r.on_unverifiable, on_fail.clone())?,
            on_fail,
            line: l,
        })
    }
}

/// An agent CLI must speak the `llm` block's dialect when it names one
/// (unset, each CLI is given its own): refused at load, before any step.
fn check_agent_dialects(
    path: &Path,
    raw: &RawPipeline,
    agents: &BTreeMap<String, AgentDef>,
    llm: Option<&LlmConfig>,
) -> Result<(), LoadError> {
    let Some((l, api)) = llm.and_then(|l| l.api.map(|a| (l, a))) else {
        return Ok(());
    };
    for def in agents.values() {
        let Ok(spec) = def.runner.parse::<belay_agent::AgentSpec>() else {
            continue;
        };
        let base = l.base_url.as_deref().unwrap_or("(the vendor's)");
        if let Err(e) = spec.check_dialect(&def.name, api, base, |native| {
            format!("remove `llm.api` (each agent CLI is then given its own dialect) or set it to `{native}`")
        }) {
            let step = raw
                .steps
                .iter()
                .find(|s| s.value.agent.as_deref() == Some(def.name.as_str()));
            let (line, col) = step
                .map(|s| (s.referenced.line(), s.referenced.column()))
                .unwrap_or((1, 1));
            return Err(located(path, line, col, e.to_string()));
        }
    }
    Ok(())
}

/// Load the agent file of every agent step (`<agents_dir>/<name>.agent.md`).
fn load_agents(
    path: &Path,
    dir: &Path,
    raw: &RawPipeline,
    agent_names: &[String],
) -> Result<BTreeMap<String, AgentDef>, LoadError> {
    let err = |line: u64, column: u64, message: String| located(path, line, column, message);
    let mut agents = BTreeMap::new();
    if !agent_names.is_empty() {
        let Some(adir) = &raw.agents_dir else {
            return Err(err(
                1,
                1,
                "agent steps need `agents_dir` (where `<name>.agent.md` files are)".into(),
            ));
        };
        for name in agent_names {
            let file = dir.join(adir).join(format!("{name}.agent.md"));
            let step = raw
                .steps
                .iter()
                .find(|s| s.value.agent.as_deref() == Some(name.as_str()));
            let (l, c) = step
                .map(|s| (s.referenced.line(), s.referenced.column()))
                .unwrap_or((1, 1));
            let def = load_agent(&file, name).map_err(|e| err(l, c, e.to_string()))?;
            agents.insert(name.clone(), def);
        }
    }
    Ok(agents)
}

/// Why an agent file cannot be used; the caller places it at the step.
#[derive(Debug, thiserror::Error)]
enum AgentFileError {
    #[error("agent `{name}`: cannot read {}: {source}", path.display())]
    Read {
        name: String,
        path: PathBuf,
        #[source]
        source: ToolingReadError,
    },
    #[error("{}: an agent file starts with `---` and YAML front matter (name, tools)", path.display())]
    NoFrontMatter { path: PathBuf },
    #[error("{}: the front matter has no closing `---`", path.display())]
    Unclosed { path: PathBuf },
    #[error("{}: front matter (from line 2): {source}", path.display())]
    FrontMatter {
        path: PathBuf,
        /// Boxed: the parser's error is large.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("{}: front matter says `name: {said}`, the file is for `{name}`", path.display())]
    OtherName {
        path: PathBuf,
        said: String,
        name: String,
    },
    /// `line` is the 1-based line of `runner:`, when the file has one.
    #[error(
        "{}{}: runner: {source}",
        path.display(),
        line.map(|l| format!(":{l}")).unwrap_or_default()
    )]
    Runner {
        path: PathBuf,
        line: Option<usize>,
        #[source]
        source: belay_agent::SpecError,
    },
    #[error("{}: the prompt (after the front matter) is empty", path.display())]
    EmptyPrompt { path: PathBuf },
}

/// Read an agent file: YAML front matter between `---` lines, then the prompt.
fn load_agent(file: &Path, name: &str) -> Result<AgentDef, AgentFileError> {
    let path = || file.to_path_buf();
    let text = read_tooling_text(file).map_err(|source| AgentFileError::Read {
        name: name.to_string(),
        path: path(),
        source,
    })?;
    let rest = text
        .strip_prefix("---\n")
        .ok_or_else(|| AgentFileError::NoFrontMatter { path: path() })?;
    let end = rest
        .find("\n---")
        .ok_or_else(|| AgentFileError::Unclosed { path: path() })?;
    let fm: FrontMatter =
        serde_saphyr::from_str(&rest[..end]).map_err(|source| AgentFileError::FrontMatter {
            path: path(),
            source: Box::new(source),
        })?;
    let _ = fm.description;
    if fm.name != name {
        return Err(AgentFileError::OtherName {
            path: path(),
            said: fm.name,
            name: name.to_string(),
        });
    }
    let runner = fm.runner.unwrap_or_else(|| "builtin".into());
    if let Err(source) = runner.parse::<belay_agent::AgentSpec>() {
        let line = text
            .lines()
            .position(|l| l.trim_start().starts_with("runner:"))
            .map(|i| i + 1);
        return Err(AgentFileError::Runner {
            path: path(),
            line,
            source,
        });
    }
    let prompt = rest[end + 4..]
        .trim_start_matches(['-', '\n'])
        .trim()
        .to_string();
    if prompt.is_empty() {
        return Err(AgentFileError::EmptyPrompt { path: path() });
    }
    Ok(AgentDef {
        name: fm.name,
        tools: fm.tools,
        runner,
        model: fm.model,
        prompt,
        path: file.to_path_buf(),
    })
}
