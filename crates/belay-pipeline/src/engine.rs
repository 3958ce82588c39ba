//! The executor: steps in sandbox containers, gates, routing, state after
//! every transition, resume, and the one commit point.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belay_agent::builtin::{BuiltinAgent, BuiltinConfig};
use belay_agent::workspace::ContainerWorkspace;
use belay_agent::AgentEvent;
use belay_model::{Api, ClientConfig, ModelClient, ModelSetup, PriceTable};
use belay_record::{EventSink, Redactor, RunLock};
use belay_sandbox::{
    ContainerRuntime, ContainerSpec, ExecSpec, Mount, Network, NoopObserver, SandboxError,
};
use belay_vcs::Git;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::events::{Event, Kind};
use crate::schema::{Access, DepsPolicy, Pipeline, Route, Step, StepKind};
use crate::state::{RunFiles, RunState, Status};
use crate::verdict::{self, Verdict};

/// Where the workspace is inside step containers.
pub const WORKDIR: &str = "/workspace/repo";
/// The default image of step containers.
pub const DEFAULT_IMAGE: &str = "belay-base:bookworm";
/// The user of step containers' own processes (their init and idle main
/// process, which outlive every step): not the steps' user, so a step cannot
/// ptrace them, write their memory or signal them.
const IDLE_USER: &str = "65534:65534";
/// How much of a failing gate's output becomes feedback.
const FEEDBACK_MAX: usize = 8 * 1024;
/// How much of a shared file goes into an agent's context.
const SHARED_MAX: usize = 32 * 1024;
const ALLOWED_ENV_FILES: [&str; 3] = [".env.example", ".env.template", ".env.sample"];

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Bad configuration or input: exit 2.
    #[error("{0}")]
    Config(String),
    /// The container engine failed: exit 3.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Record(#[from] belay_record::RecordError),
    #[error(transparent)]
    Vcs(#[from] belay_vcs::VcsError),
    /// A service belay runs for the sandbox (the egress proxy, the model
    /// route, a network's fence) or the host's file system failed: exit 3.
    #[error("{0}")]
    Infra(String),
    /// The run itself went wrong (an agent failed, a step broke a rule
    /// mid-run): exit 1.
    #[error("{0}")]
    Failed(String),
}

impl belay_record::Classify for PipelineError {
    fn exit_class(&self) -> belay_record::ExitClass {
        use belay_record::ExitClass;
        match self {
            PipelineError::Config(_) => ExitClass::Usage,
            PipelineError::Sandbox(e) => e.exit_class(),
            PipelineError::Record(e) => e.exit_class(),
            PipelineError::Vcs(e) => e.exit_class(),
            PipelineError::Infra(_) => ExitClass::Infra,
            PipelineError::Failed(_) => ExitClass::Failed,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub resume: Option<String>,
    pub max_attempts: Option<u32>,
    /// Re-run every `setup:` (ignore the stamps).
    pub refresh: bool,
    pub state_dir: Option<PathBuf>,
}

/// How a run ended.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub run_id: String,
    pub status: Status,
    pub commit: Option<String>,
    pub failure: Option<String>,
    pub run_dir: PathBuf,
    pub attempts: u32,
    pub step_runs: u64,
    pub duration_s: f64,
    /// belay's own peak resident memory over the run.
    pub peak_rss_bytes: Option<u64>,
}

/// The state directory of a pipeline: `--state-dir`, the file's `state_dir`,
/// or `~/.local/state/belay/pipelines/<name>-<hash>` (outside the workspace, so
/// that no step can touch it).
pub fn state_dir_for(p: &Pipeline, cli: Option<&Path>) -> PathBuf {
    if let Some(d) = cli {
        return d.to_path_buf();
    }
    if let Some(d) = &p.state_dir {
        return p.dir.join(d);
    }
    let canon = std::fs::canonicalize(&p.path).unwrap_or_else(|_| p.path.clone());
    let h = hex::encode(Sha256::digest(canon.to_string_lossy().as_bytes()));
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("/var/lib"));
    base.join("belay/pipelines")
        .join(format!("{}-{}", sanitize(&p.name), &h[..12]))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Resolve the secret refs host-side. Every ref a step lists must resolve; the
/// error names the ref, the step and the variable.
pub fn resolve_secrets(p: &Pipeline) -> Result<BTreeMap<String, String>, PipelineError> {
    let mut out = BTreeMap::new();
    for s in &p.steps {
        for r in &s.secrets {
            if out.contains_key(r) {
                continue;
            }
            let Some(def) = p.secrets.get(r) else {
                return Err(PipelineError::Config(format!(
                    "step `{}` lists secret `{r}`, which is not declared",
                    s.name
                )));
            };
            match std::env::var(&def.key) {
                Ok(v) if !v.is_empty() => {
                    out.insert(r.clone(), v);
                }
                _ => {
                    return Err(PipelineError::Config(format!(
                        "secret `{r}` (used by step `{}`) is missing: set the environment variable {} (provider `{}`)",
                        s.name, def.key, def.from
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// The workspace's tooling, relative to the git root: the pipeline file,
/// `agents_dir` and `additional_files`.
pub fn tooling_paths(p: &Pipeline, git_root: &Path) -> Vec<String> {
    let rel = |x: &Path| -> Option<String> {
        let abs = std::fs::canonicalize(x).unwrap_or_else(|_| x.to_path_buf());
        abs.strip_prefix(git_root)
            .ok()
            .map(|r| r.to_string_lossy().into_owned())
    };
    let mut v = Vec::new();
    v.extend(rel(&p.path));
    if let Some(a) = &p.agents_dir {
        v.extend(rel(&p.dir.join(a)));
    }
    for f in &p.additional_files {
        v.extend(rel(&p.dir.join(f)));
    }
    // Policy files: a step must not be able to swap them, nor get them committed.
    if let Some(f) = &p.isolation.seccomp_profile {
        v.extend(rel(&p.dir.join(f)));
    }
    v.retain(|s| !s.is_empty());
    v
}

/// The `.env*` ban: such files in the workspace root refuse the run.
pub fn env_files(root: &Path) -> Vec<String> {
    let mut hits: Vec<String> = std::fs::read_dir(root)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| n.starts_with(".env") && !ALLOWED_ENV_FILES.contains(&n.as_str()))
                .collect()
        })
        .unwrap_or_default();
    hits.sort();
    hits
}

fn hash_file(path: &Path) -> Result<String, PipelineError> {
    let bytes = std::fs::read(path).map_err(|e| {
        PipelineError::Config(format!(
            "cannot read {}: {e}; check the path and its permissions",
            path.display()
        ))
    })?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// A relative path inside the workspace, or an error.
fn workspace_path(root: &Path, rel: &str) -> Result<PathBuf, PipelineError> {
    let p = Path::new(rel);
    if p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(PipelineError::Config(format!(
            "`{rel}` must be a path inside the workspace"
        )));
    }
    Ok(root.join(p))
}

fn parse_memory(s: &str) -> Option<i64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1i64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s.as_str(), 1),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|n| (n * mult as f64) as i64)
}

/// `64m`, `1g`, `0`: a size in bytes, for `isolation.log_limit`.
fn parse_size(s: &str) -> Option<u64> {
    parse_memory(s).and_then(|n| u64::try_from(n).ok())
}

/// This process's peak resident memory (VmHWM), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("[…]\n{}", &s[cut..])
}

/// The network of a step container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Net {
    /// No network.
    None,
    /// `network: true`: the bridge, or the egress proxy when presets are set.
    Open,
    /// An agent CLI: only the model endpoint is reachable.
    Model,
}

/// How an agent CLI in a container reaches the model: the internal network,
/// the base URL to give the CLI, extra env, and what keeps the route open.
struct ModelRoute {
    network: String,
    base_url: String,
    env: Vec<(String, String)>,
    _forward: Option<crate::egress::TcpForward>,
    _proxy: Option<crate::egress::EgressProxy>,
    _fence: belay_sandbox::firewall::Firewall,
}

/// The result of one step execution.
struct StepResult {
    verdict: Verdict,
    /// What a failing gate said (feedback for the next attempt).
    detail: String,
    exit_code: Option<i64>,
    /// An agent's `## Missing dependencies` pins (locked policy).
    missing_deps: Vec<String>,
}

pub struct Engine<'a> {
    p: &'a Pipeline,
    rt: Arc<dyn ContainerRuntime>,
    git: Git,
    files: RunFiles,
    state: RunState,
    sink: EventSink,
    redactor: Redactor,
    secrets: BTreeMap<String, String>,
    /// Step containers by network, workspace access and the secrets their
    /// steps hold: a secret never reaches a container that a step without it
    /// uses later.
    containers: HashMap<(Net, Access, String), String>,
    /// Build-environment directories the image has under the workspace path
    /// (`.venv`, `node_modules`...), each kept in a named volume of the run
    /// that Docker fills from the image: a bind-mounted workspace would hide them.
    env_volumes: Option<Vec<(String, String)>>,
    /// The internal network and the allowlisting proxy of networked steps,
    /// when the pipeline names egress presets.
    egress: Option<(
        String,
        crate::egress::EgressProxy,
        belay_sandbox::firewall::Firewall,
    )>,
    /// The run's own bridge for `network: true` steps without presets: the
    /// internet, but not the host's services.
    open_net: Option<(String, belay_sandbox::firewall::Firewall)>,
    /// The seccomp profile, read and hashed once at the start: (path, text, sha256).
    seccomp: Option<(PathBuf, String, String)>,
    model_route: Option<ModelRoute>,
    model: Option<ModelClient>,
    image: String,
    state_dir: PathBuf,
    refresh: bool,
    _lock: RunLock,
    t0: Instant,
    /// Nested `.git` entries the last end-of-step walk found.
    nested_git: Vec<String>,
    /// Tokens and cost of the agents so far (for the run registry).
    tokens: u64,
    cost_usd: f64,
    registry: belay_record::Registry,
}

/// Load-time checks that need the host: git state of the tooling, the `.env`
/// ban, the secrets. Returns the git handle, whether the worktree was clean,
/// and the resolved secrets.
async fn host_checks(
    p: &Pipeline,
    state_dir: &Path,
) -> Result<(Git, bool, BTreeMap<String, String>), PipelineError> {
    let git = Git::open(&p.dir, &state_dir.join("no-hooks")).await?;
    let root = git.root().to_path_buf();
    if let Ok(sd) = std::fs::canonicalize(state_dir) {
        if sd.starts_with(&root) {
            return Err(PipelineError::Config(format!(
                "the state directory {} is inside the workspace {}, where steps could change it: set `state_dir` (or --state-dir) outside",
                sd.display(),
                root.display()
            )));
        }
    }
    let tooling = tooling_paths(p, &root);
    let refs: Vec<&str> = tooling.iter().map(String::as_str).collect();
    let dirty = git.dirty(&refs).await?;
    if !dirty.is_empty() {
        return Err(PipelineError::Config(format!(
            "the pipeline's tooling must be committed before a run; these files differ from HEAD: {}. Commit them (git add + git commit) and rerun",
            dirty.join(", ")
        )));
    }
    let envs = env_files(&root);
    if !envs.is_empty() {
        return Err(PipelineError::Config(format!(
            "the workspace holds {}: secrets belong in the host environment and `secrets:` refs, not in files steps can read. Move them out of {} (.env.example, .env.template and .env.sample are allowed)",
            envs.join(", "),
            root.display()
        )));
    }
    let clean = git.dirty(&[]).await?.is_empty();
    let secrets = resolve_secrets(p)?;
    Ok((git, clean, secrets))
}

/// The variable that holds the model key: `llm.api_key_env`, else the dialect's usual one.
fn key_env_of(llm: &crate::schema::LlmConfig) -> String {
    llm.api_key_env.clone().unwrap_or_else(|| {
        if llm.api == Some(Api::Anthropic) {
            "ANTHROPIC_API_KEY"
        } else {
            "OPENAI_API_KEY"
        }
        .to_string()
    })
}

/// The pipeline's model client, and its key (name, value) for the redactor.
type ModelAndKey = (Option<ModelClient>, Option<(String, String)>);

fn model_client(p: &Pipeline, path: PathBuf) -> Result<ModelAndKey, PipelineError> {
    let Some(llm) = &p.llm else {
        return Ok((None, None));
    };
    let api = llm.api.unwrap_or(Api::Responses);
    let key_env = key_env_of(llm);
    let key = std::env::var(&key_env).ok().filter(|k| !k.is_empty());
    if key.is_none() && llm.base_url.is_none() {
        return Err(PipelineError::Config(format!(
            "the pipeline's llm needs its key: set {key_env} (named by llm.api_key_env), or give llm.base_url for a server that needs none"
        )));
    }
    let base = llm
        .base_url
        .clone()
        .unwrap_or_else(|| ClientConfig::default_base_url(api).to_string());
    let mut cfg = ClientConfig::new(api, &base, &llm.model);
    cfg.key = key.clone().map(belay_model::Secret::new);
    cfg.timeout = llm.timeout.map(Duration::from_secs);
    let setup = ModelSetup {
        config: cfg,
        prices: PriceTable::builtin(),
    };
    let client = setup
        .client(Some(path))
        .map_err(|e| PipelineError::Config(e.to_string()))?;
    Ok((Some(client), key.map(|k| (key_env, k))))
}

impl<'a> Engine<'a> {
    /// Check the host, take the lock, and create (or reopen, for a resume) the run.
    pub async fn start(
        p: &'a Pipeline,
        rt: Arc<dyn ContainerRuntime>,
        opts: &RunOptions,
    ) -> Result<Engine<'a>, PipelineError> {
        let state_dir = state_dir_for(p, opts.state_dir.as_deref());
        std::fs::create_dir_all(&state_dir).map_err(|e| {
            PipelineError::Config(format!(
                "cannot create the state directory {}: {e}",
                state_dir.display()
            ))
        })?;
        let lock = RunLock::acquire(&state_dir.join("pipeline.lock")).map_err(|e| match e {
            belay_record::RecordError::Locked { .. } => PipelineError::Config(format!(
                "another belay run of this pipeline is in progress (lock {}); wait for it to finish",
                state_dir.join("pipeline.lock").display()
            )),
            other => other.into(),
        })?;
        let (git, clean, secrets) = host_checks(p, &state_dir).await?;
        let pipeline_hash = hash_file(&p.path)?;
        let now = belay_record::now_rfc3339();
        let (files, state) = match &opts.resume {
            Some(id) => {
                belay_record::run_id::validate(id)
                    .map_err(|e| PipelineError::Config(e.to_string()))?;
                let files = RunFiles::new(&state_dir, id);
                let text = std::fs::read(files.state()).map_err(|e| {
                    PipelineError::Config(format!(
                        "no run {id} to resume ({}: {e}); list runs in {}",
                        files.state().display(),
                        state_dir.join("runs").display()
                    ))
                })?;
                let mut st: RunState = serde_json::from_slice(&text).map_err(|e| {
                    PipelineError::Config(format!(
                        "{}: not a run state: {e}",
                        files.state().display()
                    ))
                })?;
                if st.pipeline_hash != pipeline_hash {
                    return Err(PipelineError::Config(format!(
                        "run {id} was started with a different {}: resume needs the same pipeline file (start a new run instead)",
                        p.path.display()
                    )));
                }
                if st.status != Status::Running {
                    return Err(PipelineError::Config(format!(
                        "run {id} already ended ({:?}); nothing to resume",
                        st.status
                    )));
                }
                if let Some(n) = opts.max_attempts {
                    st.max_attempts = n;
                }
                (files, st)
            }
            None => {
                let id = belay_record::run_id::generate(&sanitize(&p.name));
                let files = RunFiles::new(&state_dir, &id);
                let st = RunState {
                    version: 1,
                    run_id: id,
                    pipeline: p.path.clone(),
                    pipeline_hash,
                    status: Status::Running,
                    current: p.steps.first().map(|s| s.name.clone()),
                    attempt: 1,
                    max_attempts: opts.max_attempts.unwrap_or(p.max_attempts),
                    step_runs: 0,
                    feedback: None,
                    verdicts: BTreeMap::new(),
                    clean_at_start: clean,
                    head_at_start: git.head().await.unwrap_or_default(),
                    commit: None,
                    commit_pending: None,
                    failure: None,
                    submodules_at_start: git.submodule_paths().await.unwrap_or_default(),
                    git_control_at_start: git.control_files(),
                    started_at: now.clone(),
                    updated_at: now,
                };
                (files, st)
            }
        };
        std::fs::create_dir_all(files.logs()).map_err(|e| {
            PipelineError::Config(format!(
                "cannot create {}: {e}. Pass --state-dir with a writable directory",
                files.logs().display()
            ))
        })?;
        let (model, key) = model_client(p, files.llm_usage())?;
        let mut redactor = Redactor::default();
        for (name, v) in &secrets {
            redactor.add(name.clone(), v.clone());
        }
        let mut secrets = secrets;
        if let Some((name, k)) = key {
            redactor.add(name.clone(), k.clone());
            // The model key is checked like the step secrets (at the commit).
            secrets.entry(format!("llm key ${name}")).or_insert(k);
        }
        let sink = EventSink::open(
            &files.events(),
            &state.run_id,
            belay_record::Mode::Pipeline,
            redactor.clone(),
        )?;
        // Containers a killed run left behind.
        let _ = belay_sandbox::reaper::reap_orphans(rt.as_ref()).await;
        let image = p
            .isolation
            .image
            .clone()
            .unwrap_or_else(|| DEFAULT_IMAGE.into());
        if !rt.image_exists(&image).await? {
            return Err(PipelineError::Config(format!(
                "isolation.image {image} is not on this Docker engine: build it (`belay env build` prints one) or run `belay image bootstrap` for {DEFAULT_IMAGE}"
            )));
        }
        let seccomp = match &p.isolation.seccomp_profile {
            Some(f) => {
                let path = p.dir.join(f);
                let text = read_policy(&path, git.root()).map_err(|e| {
                    PipelineError::Config(format!("isolation.seccomp_profile {f}: {e}. Give the path of a seccomp JSON profile (a regular file of at most 1 MiB), relative to the pipeline file"))
                })?;
                let hash = hex::encode(Sha256::digest(text.as_bytes()));
                Some((path, text, hash))
            }
            None => None,
        };
        // The chains of internal networks that a killed run left.
        belay_sandbox::firewall::sweep_stale();
        let mut e = Engine {
            p,
            rt,
            git,
            files,
            state,
            sink,
            redactor,
            secrets,
            containers: HashMap::new(),
            env_volumes: None,
            egress: None,
            open_net: None,
            seccomp,
            model_route: None,
            model,
            image,
            state_dir,
            refresh: opts.refresh,
            _lock: lock,
            t0: Instant::now(),
            nested_git: Vec::new(),
            tokens: 0,
            cost_usd: 0.0,
            registry: belay_record::Registry::default_location(),
        };
        // Every run of every mode is in the user's registry (`belay runs`).
        if let Err(err) = e.registry.started(
            &e.state.run_id,
            belay_record::Mode::Pipeline,
            &e.files.root,
            Some(&p.name),
        ) {
            tracing::warn!("the run is not in the registry: {err}");
        }
        let kind = if opts.resume.is_some() {
            Kind::RunResumed
        } else {
            Kind::RunStarted
        };
        let data = serde_json::json!({"pipeline": p.path, "attempt": e.state.attempt, "max_attempts": e.state.max_attempts,
            "current": e.state.current, "clean_at_start": e.state.clean_at_start});
        e.event(kind, None, data)?;
        e.save()?;
        Ok(e)
    }

    pub fn run_id(&self) -> &str {
        &self.state.run_id
    }

    pub fn run_dir(&self) -> &Path {
        &self.files.root
    }

    fn save(&mut self) -> Result<(), PipelineError> {
        self.state.updated_at = belay_record::now_rfc3339();
        let text = serde_json::to_string_pretty(&self.state)
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        belay_record::atomic_write(&self.files.state(), self.redactor.redact(&text).as_bytes())?;
        Ok(())
    }

    fn event(
        &mut self,
        kind: Kind,
        step: Option<&str>,
        data: serde_json::Value,
    ) -> Result<(), PipelineError> {
        self.sink
            .emit(kind.source(), step, &Event { kind, data: &data })?;
        Ok(())
    }

    /// Run until success or failure.
    pub async fn run(mut self) -> Result<Outcome, PipelineError> {
        let result = self.drive().await;
        for (_, c) in self.containers.drain() {
            let _ = self.rt.remove(&c).await;
        }
        let model_net = self.model_route.take().map(|r| r.network);
        if let Some((net, proxy, fence)) = self.egress.take() {
            drop(proxy);
            drop(fence);
            let _ = self.rt.remove_network(&net).await;
        }
        if let Some(net) = model_net {
            let _ = self.rt.remove_network(&net).await;
        }
        if let Some((net, fence)) = self.open_net.take() {
            drop(fence);
            let _ = self.rt.remove_network(&net).await;
        }
        // A finished run drops its environment volumes; an interrupted one
        // keeps them for its resume.
        if self.state.status != Status::Running {
            for (name, _) in self.env_volumes.take().unwrap_or_default() {
                let _ = self.rt.remove_volume(&name).await;
            }
        }
        if let Err(e) = &result {
            // A config or engine error mid-run: the run can be resumed.
            let _ = self.event(
                Kind::RunInterrupted,
                None,
                serde_json::json!({"error": e.to_string()}),
            );
        }
        result?;
        let end = belay_record::RunEnd {
            ok: self.state.status == Status::Succeeded,
            duration_s: self.t0.elapsed().as_secs_f64(),
            tokens: self.tokens,
            cost_usd: self.cost_usd,
            summary: self.state.failure.clone(),
        };
        if let Err(err) = self.registry.ended(&self.state.run_id, end) {
            tracing::warn!("the run's end is not in the registry: {err}");
        }
        let outcome = Outcome {
            run_id: self.state.run_id.clone(),
            status: self.state.status,
            commit: self.state.commit.clone(),
            failure: self.state.failure.clone(),
            run_dir: self.files.root.clone(),
            attempts: self.state.attempt,
            step_runs: self.state.step_runs,
            duration_s: self.t0.elapsed().as_secs_f64(),
            peak_rss_bytes: peak_rss_bytes(),
        };
        let text = serde_json::to_string_pretty(&outcome)
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        belay_record::atomic_write(
            &self.files.summary(),
            self.redactor.redact(&text).as_bytes(),
        )?;
        Ok(outcome)
    }

    async fn drive(&mut self) -> Result<(), PipelineError> {
        // A routing cycle without retries must still end.
        let cap = (self.p.steps.len() as u64 + 1) * u64::from(self.state.max_attempts) * 4 + 16;
        while let Some(name) = self.state.current.clone() {
            if self.state.step_runs >= cap {
                return self.finish(Status::Failed, Some(format!("stopped after {cap} step runs: the routing loops without consuming attempts")));
            }
            let step = self.p.step(&name).cloned().ok_or_else(|| {
                PipelineError::Config(format!(
                    "the state names step `{name}`, which the pipeline does not have"
                ))
            })?;
            self.state.step_runs += 1;
            self.save()?;
            let n = self.state.step_runs;
            self.event(
                Kind::StepStart,
                Some(&name),
                serde_json::json!({"n": n, "attempt": self.state.attempt, "step_kind": &step.kind}),
            )?;
            let t = Instant::now();
            let r = self.run_step(&step, n).await;
            let took = t.elapsed().as_secs_f64();
            // The end of a step happens even when it failed to run.
            self.end_step_processes(&name).await?;
            let r = r?;
            self.scrub_outputs(&step)?;
            let decisions = self
                .egress
                .as_ref()
                .map(|(_, p, _)| p.drain())
                .unwrap_or_default();
            for d in decisions {
                self.event(
                    Kind::Egress,
                    Some(&name),
                    serde_json::to_value(&d).unwrap_or_default(),
                )?;
            }
            self.event(Kind::StepEnd, Some(&name), serde_json::json!({"n": n, "verdict": r.verdict, "exit_code": r.exit_code, "duration_s": (took * 1000.0).round() / 1000.0}))?;
            if !r.missing_deps.is_empty() {
                let lock = self.p.lockfiles.join(", ");
                return self.finish(Status::Failed, Some(format!("step `{name}` needs dependencies the lockfile does not have. Extend {lock} with these pins and re-run: {}", r.missing_deps.join(", "))));
            }
            if matches!(step.kind, StepKind::Command { .. }) || step.artifact.is_some() {
                self.state.verdicts.insert(name.clone(), r.verdict);
            }
            let route = match r.verdict {
                Verdict::Pass => step.on_pass.clone(),
                Verdict::Fail | Verdict::Retry => step.on_fail.clone(),
                Verdict::Unverifiable => step.on_unverifiable.clone(),
            };
            if r.verdict != Verdict::Pass {
                let fb = format!(
                    "Step `{name}` did not pass (verdict: {:?}{}).\n{}",
                    r.verdict,
                    r.exit_code
                        .map(|c| format!(", exit code {c}"))
                        .unwrap_or_default(),
                    tail(&r.detail, FEEDBACK_MAX)
                );
                self.state.feedback = Some(self.redactor.redact(&fb).into_owned());
            }
            self.event(
                Kind::Route,
                Some(&name),
                serde_json::json!({"verdict": r.verdict, "to": route.describe()}),
            )?;
            match route {
                Route::Success => return self.finish(Status::Succeeded, None),
                Route::Failure => {
                    let why = format!("step `{name}` routed to failure ({:?})", r.verdict);
                    return self.finish(Status::Failed, Some(why));
                }
                Route::Step { step: next, retry } => {
                    if retry {
                        if self.state.attempt >= self.state.max_attempts {
                            let why = format!(
                                "all {} attempts used; the last failing gate was `{name}`",
                                self.state.max_attempts
                            );
                            return self.finish(Status::Failed, Some(why));
                        }
                        self.state.attempt += 1;
                        self.state.verdicts.clear();
                        let a = self.state.attempt;
                        self.event(Kind::Attempt, None, serde_json::json!({"attempt": a, "max_attempts": self.state.max_attempts}))?;
                    }
                    self.state.current = Some(next);
                    self.save()?;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, status: Status, failure: Option<String>) -> Result<(), PipelineError> {
        self.state.status = status;
        self.state.current = None;
        self.state.failure = failure.clone();
        self.save()?;
        let commit = self.state.commit.clone();
        self.event(Kind::RunEnd, None, serde_json::json!({"status": status, "failure": failure, "commit": commit, "attempts": self.state.attempt, "step_runs": self.state.step_runs}))
    }

    /// End the step in every container of the run: kill every process it
    /// left (a background job must not outlive its step and read the next
    /// step's secrets or touch the tree after its gates), by pid namespace and
    /// recorded identity, never by name; and empty `/tmp` (the steps' `HOME`)
    /// and `/dev/shm`.
    async fn end_step_processes(&mut self, step: &str) -> Result<(), PipelineError> {
        let containers: Vec<String> = self.containers.values().cloned().collect();
        let mut killed = 0;
        for c in containers {
            killed += self.rt.end_step(&c).await?;
        }
        if killed > 0 {
            self.event(
                Kind::ProcessesEnded,
                Some(step),
                serde_json::json!({"killed": killed}),
            )?;
        }
        // A step runs as root: a set-id file it left would be a root shell
        // for anyone on the host.
        let root = self.git.root().to_path_buf();
        let swept = belay_sandbox::hostfs::sweep_workspace(&root).map_err(|e| {
            PipelineError::Infra(format!("cannot check the workspace for set-id files after step `{step}`: {e}. belay walks the whole workspace as root after every step; a path it cannot open stops the run. Remove that path, then resume the run"))
        })?;
        self.nested_git = swept.nested_git;
        let setid = swept.setid_cleared;
        if !setid.is_empty() {
            self.event(
                Kind::SetidCleared,
                Some(step),
                serde_json::json!({"paths": cap_list(&setid)}),
            )?;
        }
        if self.p.isolation.allow_git_mutations {
            self.check_git_control(step)?;
        }
        Ok(())
    }

    /// With git mutations allowed, a step may commit, but not redirect git:
    /// a changed `commondir`, `config.worktree` or alternates file is put
    /// back (removed when it was absent) and stops the run.
    fn check_git_control(&mut self, step: &str) -> Result<(), PipelineError> {
        if self.state.git_control_at_start.is_empty() {
            self.state.git_control_at_start = self.git.control_files();
            return Ok(());
        }
        let changed = self
            .git
            .restore_control_files(&self.state.git_control_at_start);
        if changed.is_empty() {
            return Ok(());
        }
        self.event(
            Kind::GitTampered,
            Some(step),
            serde_json::json!({"files": &changed}),
        )?;
        Err(PipelineError::Failed(format!(
            "step `{step}` changed git's control files ({}) in {}: they redirect git to another config, whose commands the next host git would run. Planted files were removed; check the repository, then start a new run",
            changed.join(", "),
            self.git.git_dir().display()
        )))
    }

    /// Scrub secret values out of a step's declared outputs (its artifact and
    /// `produces` files): they are records of the run, and may be read by the
    /// next steps and by people.
    fn scrub_outputs(&mut self, step: &Step) -> Result<(), PipelineError> {
        if self.redactor.is_empty() {
            return Ok(());
        }
        let root = self.git.root().to_path_buf();
        for rel in step.produces.iter().chain(step.artifact.iter()) {
            // Streamed: any size, nothing cut, never through a link.
            match belay_sandbox::hostfs::scrub(&root, rel, &self.redactor) {
                Ok(true) => self.event(
                    Kind::ArtifactScrubbed,
                    Some(&step.name),
                    serde_json::json!({"path": rel}),
                )?,
                Ok(false) => {}
                Err(e @ belay_sandbox::hostfs::HostFsError::Refused { .. }) => self.event(
                    Kind::ArtifactUnreachable,
                    Some(&step.name),
                    serde_json::json!({"path": rel, "why": e.to_string()}),
                )?,
                Err(e) => {
                    return Err(PipelineError::Infra(format!(
                        "cannot scrub {rel}: {e}; check that belay may write the workspace"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Delete a step's declared outputs before an attempt (stale artifacts never decide).
    fn hygiene(&mut self, step: &Step) -> Result<(), PipelineError> {
        let root = self.git.root().to_path_buf();
        for rel in step.produces.iter().chain(step.artifact.iter()) {
            workspace_path(&root, rel)?;
            let removed = match belay_sandbox::hostfs::remove(&root, rel) {
                Ok(r) => r,
                // A link on the way (a step's doing): there is no stale file
                // belay could read through it, so nothing to delete.
                Err(e @ belay_sandbox::hostfs::HostFsError::Refused { .. }) => {
                    self.event(
                        Kind::ArtifactUnreachable,
                        Some(&step.name),
                        serde_json::json!({"path": rel, "why": e.to_string()}),
                    )?;
                    false
                }
                Err(e) => {
                    return Err(PipelineError::Infra(format!(
                    "cannot delete the stale {rel}: {e}; check that belay may write the workspace"
                )))
                }
            };
            if removed {
                self.event(
                    Kind::ArtifactDeleted,
                    Some(&step.name),
                    serde_json::json!({"path": rel}),
                )?;
            }
        }
        Ok(())
    }

    /// The run's bridge for `network: true` (made on first use): NAT to the
    /// outside like the default bridge, but fenced so that nothing on the
    /// host itself (a database on all addresses, the engine's swarm ports)
    /// is reachable from it.
    async fn open_network(&mut self) -> Result<String, PipelineError> {
        if let Some((net, _)) = &self.open_net {
            return Ok(net.clone());
        }
        let net = format!("belay-{}-open", self.state.run_id);
        let info = self.rt.ensure_network(&net, false).await?;
        let bridge = info.bridge.as_deref().ok_or_else(|| {
            PipelineError::Infra(format!("network {net} has no bridge interface belay can fence: remove it (`docker network rm {net}`) and rerun"))
        })?;
        let gw: std::net::IpAddr = info.gateway.parse().map_err(|_| {
            PipelineError::Infra(format!(
                "network {net} has no usable gateway ({}): remove it and rerun",
                info.gateway
            ))
        })?;
        let fence = belay_sandbox::firewall::Firewall::lock(bridge, gw, &[])?;
        self.event(
            Kind::OpenNetwork,
            None,
            serde_json::json!({"network": &net, "firewall": fence.chain()}),
        )?;
        self.open_net = Some((net.clone(), fence));
        Ok(net)
    }

    /// The internal network and the proxy on it (started on first use):
    /// (network name, proxy URL).
    async fn egress_proxy(&mut self) -> Result<(String, String), PipelineError> {
        if let Some((net, proxy, _)) = &self.egress {
            return Ok((net.clone(), format!("http://{}", proxy.addr)));
        }
        let net = format!("belay-{}-egress", self.state.run_id);
        let info = self.rt.ensure_network(&net, true).await?;
        let gw = info.gateway.clone();
        let ip: std::net::IpAddr = gw.parse().map_err(|_| {
            PipelineError::Infra(format!(
                "network {net} has no usable gateway address ({gw})"
            ))
        })?;
        let allow = crate::egress::package_registries();
        let proxy =
            crate::egress::EgressProxy::start(std::net::SocketAddr::new(ip, 0), allow.clone())
                .await
                .map_err(|e| {
                    PipelineError::Infra(format!("cannot start the egress proxy on {ip}: {e}. The internal network's gateway must be an address of this host: remove the network (`docker network rm`) and rerun"))
                })?;
        let url = format!("http://{}", proxy.addr);
        let fence = fence(&net, &info, proxy.addr)?;
        self.event(Kind::EgressProxy, None, serde_json::json!({"network": &net, "proxy": &url, "presets": &self.p.egress.presets, "allowed_hosts": &allow.hosts, "allowed_ports": &allow.ports,
            "firewall": fence.chain()}))?;
        self.egress = Some((net.clone(), proxy, fence));
        Ok((net, url))
    }

    /// The route from an agent CLI's container to the model endpoint (made on
    /// first use): an internal network, and on the host either a TCP forwarder
    /// to a loopback endpoint or a proxy that allows only the endpoint's host.
    async fn model_route(&mut self) -> Result<&ModelRoute, PipelineError> {
        if self.model_route.is_none() {
            let llm = self.p.llm.clone().ok_or_else(|| {
                PipelineError::Config(
                    "agent CLIs need the pipeline's `llm` block (model, base_url)".into(),
                )
            })?;
            let api = llm.api.unwrap_or(Api::Responses);
            let base = llm
                .base_url
                .clone()
                .unwrap_or_else(|| ClientConfig::default_base_url(api).to_string());
            let host = crate::egress::url_host(&base).ok_or_else(|| {
                PipelineError::Config(format!("llm.base_url `{base}` has no host: give a URL such as http://127.0.0.1:8081/v1"))
            })?;
            let net = format!("belay-{}-model", self.state.run_id);
            let info = self.rt.ensure_network(&net, true).await?;
            let gw = info.gateway.clone();
            let ip: std::net::IpAddr = gw.parse().map_err(|_| {
                PipelineError::Infra(format!("network {net} has no usable gateway ({gw}): remove it (`docker network rm {net}`) and rerun"))
            })?;
            let (scheme, rest) = base.split_once("://").unwrap_or(("http", base.as_str()));
            let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("");
            let loopback = host == "localhost" || host.starts_with("127.") || host == "::1";
            let route = if loopback {
                let default_port = if scheme == "https" { 443 } else { 80 };
                let port = crate::egress::url_port(&base).unwrap_or(default_port);
                let upstream = if host == "::1" {
                    format!("[::1]:{port}")
                } else {
                    format!("127.0.0.1:{port}")
                };
                let fwd =
                    crate::egress::TcpForward::start(std::net::SocketAddr::new(ip, 0), upstream)
                        .await
                        .map_err(|e| {
                            PipelineError::Infra(format!(
                                "cannot forward to the model endpoint: {e}. The internal network's gateway must be an address of this host: remove the network (`docker network rm`) and rerun"
                            ))
                        })?;
                let url = format!("{scheme}://{}{path}", fwd.addr);
                let fence = fence(&net, &info, fwd.addr)?;
                ModelRoute {
                    network: net,
                    base_url: url,
                    env: vec![],
                    _forward: Some(fwd),
                    _proxy: None,
                    _fence: fence,
                }
            } else {
                let proxy = crate::egress::EgressProxy::start(
                    std::net::SocketAddr::new(ip, 0),
                    crate::egress::Allow::hosts([host.clone()], crate::egress::url_port(&base)),
                )
                .await
                .map_err(|e| PipelineError::Infra(format!("cannot start the model proxy: {e}. The internal network's gateway must be an address of this host: remove the network (`docker network rm`) and rerun")))?;
                let purl = format!("http://{}", proxy.addr);
                let fence = fence(&net, &info, proxy.addr)?;
                let env = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
                    .iter()
                    .map(|k| (k.to_string(), purl.clone()))
                    .collect();
                ModelRoute {
                    network: net,
                    base_url: base.clone(),
                    env,
                    _forward: None,
                    _proxy: Some(proxy),
                    _fence: fence,
                }
            };
            let data = serde_json::json!({"network": &route.network, "base_url_in_container": &route.base_url, "endpoint_host": host});
            self.event(Kind::ModelRoute, None, data)?;
            self.model_route = Some(route);
        }
        self.model_route
            .as_ref()
            .ok_or_else(|| PipelineError::Config("no model route".into()))
    }

    /// An agent CLI (codex, claude, gemini) in the step's container: the CLI
    /// from the read-only agents mount, the network limited to the model
    /// endpoint, belay's own limits on its stream, its process group killed
    /// inside the container when it ends or overruns.
    async fn cli_agent(
        &mut self,
        step: &Step,
        def: &crate::schema::AgentDef,
        n: u64,
    ) -> Result<StepResult, PipelineError> {
        use belay_agent::cli::{self as agent_cli, CliAgent, CliKind, Endpoint, Launch};
        let kind: CliKind = def.runner.parse().map_err(PipelineError::Config)?;
        let dir = agents_dir();
        let program = dir.join("node_modules/.bin").join(&def.runner);
        if !program.exists() {
            return Err(PipelineError::Config(format!(
                "agent `{}` runs {}, which is not installed at {}: run ./scripts/setup-host.sh (or set BELAY_AGENTS_DIR)",
                def.name,
                def.runner,
                program.display()
            )));
        }
        let llm = self.p.llm.clone().ok_or_else(|| {
            PipelineError::Config(format!(
                "agent `{}` needs the pipeline's `llm` block",
                def.name
            ))
        })?;
        let key = std::env::var(key_env_of(&llm))
            .ok()
            .filter(|k| !k.is_empty());
        let base = self.model_route().await?.base_url.clone();
        let c = self.container(Net::Model, step.workspace, step).await?;
        let mut agent = CliAgent::new(kind);
        agent.program = program.display().to_string();
        agent.model = Some(def.model.clone().unwrap_or_else(|| llm.model.clone()));
        // The container is the sandbox: the CLI's own approvals would only stall it.
        agent.auto_approve = true;
        agent.endpoint = Some(Endpoint {
            base_url: base,
            api: llm.api.unwrap_or(Api::Responses),
            key: key.map(belay_model::Secret::new),
        });
        let task = self.context(step, &def.prompt);
        let cmd = agent
            .command(&task)
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        // Values go through the docker client's environment (`-e NAME`), never its argv.
        let mut inner_env: Vec<(String, String)> = vec![
            ("HOME".into(), "/tmp".into()),
            ("CODEX_HOME".into(), "/tmp/.codex".into()),
        ];
        inner_env.extend(cmd.env.iter().cloned());
        inner_env.extend(self.step_env(step));
        let mut argv: Vec<String> =
            vec!["docker".into(), "exec".into(), "-w".into(), WORKDIR.into()];
        if let Some(u) = self.rt.exec_user(&c) {
            argv.extend(["-u".into(), u]);
        }
        for (k, _) in &inner_env {
            argv.push("-e".into());
            argv.push(k.clone());
        }
        argv.push(c.clone());
        argv.extend(
            [
                "setsid",
                "-w",
                "sh",
                "-c",
                "mkdir -p \"${CODEX_HOME:-/tmp/.codex}\"; echo $$ > /tmp/.belay-agent.pid; exec \"$@\" < /dev/null",
                "belay-agent",
            ]
            .map(String::from),
        );
        argv.extend(cmd.argv.iter().cloned());
        let mut env = agent_cli::scrubbed_env();
        for k in [
            "DOCKER_HOST",
            "DOCKER_CONFIG",
            "DOCKER_CERT_PATH",
            "DOCKER_TLS_VERIFY",
        ] {
            if let Ok(v) = std::env::var(k) {
                env.push((k.to_string(), v));
            }
        }
        for (k, v) in &inner_env {
            env.retain(|(x, _)| x != k);
            env.push((k.clone(), v.clone()));
        }
        let launch = Launch {
            argv,
            stdin: None,
            env,
            cwd: self.files.root.clone(),
        };
        let limits = belay_agent::Limits {
            max_turns: Some(step.max_iterations.unwrap_or(30)),
            wall_time: step.timeout_s.map(Duration::from_secs),
            final_grace: Duration::from_secs(10),
            ..belay_agent::Limits::default()
        };
        let prices = PriceTable::builtin().lookup(agent.model.as_deref().unwrap_or(""));
        let mut parser = agent.parser();
        let mut live = LiveAgent::new(self.sink.clone(), &step.name);
        let result = agent_cli::run(&launch, parser.as_mut(), &limits, prices, &mut |e| {
            live.push(e)
        })
        .await;
        // Whatever the CLI left running in the container goes with it.
        let kill = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), "[ -f /tmp/.belay-agent.pid ] && kill -KILL -$(cat /tmp/.belay-agent.pid) 2>/dev/null; rm -f /tmp/.belay-agent.pid; true".into()],
            working_dir: None,
            env: vec![],
            timeout: Some(Duration::from_secs(30)),
            log_path: self.files.logs().join(format!("{n:04}-{}-cleanup.log", sanitize(&step.name))),
            log_limit: None,
        };
        let _ = self.rt.exec(&c, &kill, &self.redactor, &NoopObserver).await;
        live.finish()?;
        let report = result.map_err(|e| {
            PipelineError::Failed(format!("agent `{}` ({}): {e}", def.name, def.runner))
        })?;
        self.event(Kind::AgentReport, Some(&step.name), serde_json::json!({"runner": &def.runner, "stop": report.stop, "turns": report.turns, "usage": report.usage,
            "cost_usd": report.cost_usd, "files_changed": report.files_changed, "exit_code": report.exit_code, "final_text": tail(&report.final_text, 4096), "stderr_tail": tail(&report.stderr_tail, 2048)}))?;
        self.agent_result(step, &report)
    }

    /// An agent step's verdict: its artifact's, or whether it finished.
    fn agent_result(
        &mut self,
        step: &Step,
        report: &belay_agent::AgentReport,
    ) -> Result<StepResult, PipelineError> {
        let u = &report.usage;
        self.tokens += u.input_tokens + u.output_tokens;
        self.cost_usd += report.cost_usd;
        let missing = if self.p.deps_policy == DepsPolicy::Locked {
            missing_deps(&report.final_text)
        } else {
            vec![]
        };
        if let (Some(a), Some(v)) = (&step.artifact, &step.verdicts) {
            workspace_path(self.git.root(), a)?;
            let read = belay_sandbox::hostfs::read(self.git.root(), a, 16 * 1024 * 1024);
            return Ok(match read {
                Ok(Some(bytes)) => {
                    // Redacted before it is cut, so no secret is split.
                    let text = self
                        .redactor
                        .redact(&String::from_utf8_lossy(&bytes))
                        .into_owned();
                    let (verdict, why) = verdict::read(&text, v);
                    StepResult {
                        verdict,
                        detail: format!("{why}\n\n{}:\n{}", a, tail(&text, FEEDBACK_MAX)),
                        exit_code: None,
                        missing_deps: missing,
                    }
                }
                Ok(None) | Err(_) => StepResult {
                    verdict: Verdict::Retry,
                    detail: format!(
                        "the agent wrote no readable {a} (stop: {})",
                        report.stop.describe()
                    ),
                    exit_code: None,
                    missing_deps: missing,
                },
            });
        }
        let verdict = if report.ok() {
            Verdict::Pass
        } else {
            Verdict::Fail
        };
        Ok(StepResult {
            verdict,
            detail: format!(
                "the agent stopped: {}\n{}",
                report.stop.describe(),
                tail(&report.final_text, 2048)
            ),
            exit_code: None,
            missing_deps: missing,
        })
    }

    /// The image's build-environment directories under the workspace path
    /// (an image from `belay env build` has its venv there), found once per run.
    async fn env_volumes(&mut self) -> Result<Vec<(String, String)>, PipelineError> {
        if let Some(v) = &self.env_volumes {
            return Ok(v.clone());
        }
        let probe = self
            .rt
            .create(&ContainerSpec {
                image: self.image.clone(),
                run_id: self.state.run_id.clone(),
                kind: "pipeline-probe".into(),
                network: Network::None,
                read_only_rootfs: true,
                drop_capabilities: true,
                tmpfs: vec!["/tmp".into()],
                ..Default::default()
            })
            .await?;
        let log = self.files.logs().join("image-probe.log");
        let spec = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), format!("cd {WORKDIR} 2>/dev/null && for d in .venv venv node_modules target .tox; do [ -d \"$d\" ] && echo \"$d\"; done; true")],
            working_dir: None,
            env: vec![],
            timeout: Some(Duration::from_secs(30)),
            log_path: log,
            log_limit: None,
        };
        let out = self
            .rt
            .exec(&probe, &spec, &self.redactor, &NoopObserver)
            .await;
        let _ = self.rt.remove(&probe).await;
        let out = out?;
        let dirs: Vec<(String, String)> = out
            .stdout_tail
            .lines()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                (
                    format!(
                        "belay-{}-{}",
                        self.state.run_id,
                        sanitize(d.trim_start_matches('.'))
                    ),
                    d.to_string(),
                )
            })
            .collect();
        if !dirs.is_empty() {
            let names: Vec<&str> = dirs.iter().map(|(_, d)| d.as_str()).collect();
            self.event(
                Kind::EnvVolumes,
                None,
                serde_json::json!({"dirs": names, "image": &self.image}),
            )?;
        }
        self.env_volumes = Some(dirs.clone());
        Ok(dirs)
    }

    async fn container(
        &mut self,
        net: Net,
        access: Access,
        step: &Step,
    ) -> Result<String, PipelineError> {
        let mut held = step.secrets.clone();
        held.sort();
        let key = (net, access, held.join(","));
        if let Some(c) = self.containers.get(&key) {
            return Ok(c.clone());
        }
        let network = net == Net::Open;
        let root = self.git.root().to_path_buf();
        let env_volumes = self.env_volumes().await?;
        let mut mounts = vec![Mount {
            host: root.clone(),
            container: WORKDIR.into(),
            read_only: access == Access::Ro,
        }];
        for (name, dir) in &env_volumes {
            mounts.push(Mount {
                host: PathBuf::from(name),
                container: format!("{WORKDIR}/{dir}"),
                read_only: access == Access::Ro,
            });
        }
        let dot_git = root.join(".git");
        if dot_git.is_file() && !self.p.isolation.allow_git_mutations {
            // A worktree's or submodule's `.git` is a file naming the real
            // git dir: read-only too, so a step cannot swap in a repository
            // of its own (whose config the next host `git status` would run).
            mounts.push(Mount {
                host: dot_git.clone(),
                container: format!("{WORKDIR}/.git"),
                read_only: true,
            });
        }
        if dot_git.is_dir() {
            if !self.p.isolation.allow_git_mutations {
                // Agents read history; they cannot change it.
                mounts.push(Mount {
                    host: root.join(".git"),
                    container: format!("{WORKDIR}/.git"),
                    read_only: true,
                });
            }
            // The config they see has no credentials, and is never theirs
            // to change (a planted fsmonitor or filter stays in the copy).
            let view = self.files.root.join("git-config.sandbox");
            if !view.exists() {
                self.git.write_sanitized_config(&view).await?;
            }
            mounts.push(Mount {
                host: view,
                container: format!("{WORKDIR}/.git/config"),
                read_only: true,
            });
        }
        for c in &self.p.caches {
            let name = c
                .name
                .clone()
                .unwrap_or_else(|| sanitize(c.path.trim_start_matches('/')));
            let host = self.state_dir.join("caches").join(name);
            std::fs::create_dir_all(&host).map_err(|e| {
                PipelineError::Config(format!(
                    "cannot create the cache {}: {e}; check that the state directory is writable",
                    host.display()
                ))
            })?;
            mounts.push(Mount {
                host,
                container: c.path.clone(),
                read_only: false,
            });
        }
        let trust = belay_sandbox::trust::HostTrust::detect();
        let mut env = vec![
            ("HOME".to_string(), "/tmp".to_string()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        if let Some(src) = &trust.ca_source {
            mounts.push(Mount {
                host: src.clone(),
                container: "/etc/belay/ca-certificates.crt".into(),
                read_only: true,
            });
            env.extend(trust.ca_env());
        }
        let mut network_name = None;
        if net == Net::Model {
            let route = self.model_route().await?;
            env.extend(route.env.iter().cloned());
            env.push(("CODEX_HOME".into(), "/tmp/.codex".into()));
            network_name = Some(route.network.clone());
            let dir = agents_dir();
            mounts.push(Mount {
                host: dir.clone(),
                container: dir.display().to_string(),
                read_only: true,
            });
            if let Some(node) = host_node() {
                mounts.push(Mount {
                    host: node,
                    container: "/usr/local/bin/node".into(),
                    read_only: true,
                });
            }
        } else if network && !self.p.egress.presets.is_empty() {
            let (name, proxy_url) = self.egress_proxy().await?;
            for k in [
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "http_proxy",
                "https_proxy",
                "ALL_PROXY",
            ] {
                env.push((k.to_string(), proxy_url.clone()));
            }
            env.push(("NO_PROXY".into(), String::new()));
            network_name = Some(name);
        } else if network {
            env.extend(trust.proxy_env.iter().cloned());
            network_name = Some(self.open_network().await?);
        }
        let seccomp = match &self.seccomp {
            Some((path, text, hash)) => {
                // Read once at the start; a change since is a step's doing.
                let now = read_policy(path, self.git.root())
                    .map(|b| hex::encode(Sha256::digest(b.as_bytes())))
                    .unwrap_or_default();
                if now != *hash {
                    return Err(PipelineError::Failed(format!(
                        "isolation.seccomp_profile {} changed during the run (a step rewrote it); belay keeps the profile read at the start and refuses to go on. Restore it (git checkout -- {}) and start a new run",
                        path.display(),
                        path.display()
                    )));
                }
                Some(text.clone())
            }
            None => None,
        };
        let spec = ContainerSpec {
            image: self.image.clone(),
            run_id: self.state.run_id.clone(),
            kind: "pipeline".into(),
            network: if network {
                Network::Bridge
            } else {
                Network::None
            },
            env,
            working_dir: Some(WORKDIR.into()),
            mounts,
            read_only_rootfs: true,
            drop_capabilities: true,
            memory_bytes: self.p.isolation.memory.as_deref().and_then(parse_memory),
            pids_limit: self.p.isolation.pids,
            nano_cpus: self.p.isolation.cpus.map(|c| (c * 1e9) as i64),
            tmpfs: vec!["/tmp".into()],
            seccomp_profile: seccomp,
            network_name,
            idle_user: Some(IDLE_USER.into()),
            ..Default::default()
        };
        let id = self.rt.create(&spec).await?;
        let net_desc = match net {
            Net::None => "none",
            Net::Open if self.p.egress.presets.is_empty() => "run bridge, host fenced off",
            Net::Open => "internal + egress proxy",
            Net::Model => "internal, model endpoint only",
        };
        let memory = spec
            .memory_bytes
            .unwrap_or_else(belay_sandbox::default_memory);
        let pids = spec.pids_limit.unwrap_or(belay_sandbox::DEFAULT_PIDS);
        self.event(Kind::Sandbox, None, serde_json::json!({"container": &id, "network": net_desc, "workspace": access, "image": &self.image,
            "read_only_rootfs": true, "cap_drop": "ALL", "git_mutations": self.p.isolation.allow_git_mutations,
            "memory_bytes": memory, "pids_limit": pids, "secrets": &key.2, "seccomp": self.seccomp.as_ref().map(|s| &s.2)}))?;
        self.containers.insert(key, id.clone());
        Ok(id)
    }

    /// The cap of a step log (`isolation.log_limit`).
    fn log_limit(&self) -> Option<u64> {
        self.p.isolation.log_limit.as_deref().and_then(parse_size)
    }

    fn step_env(&self, step: &Step) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = step
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for r in &step.secrets {
            if let (Some(def), Some(v)) = (self.p.secrets.get(r), self.secrets.get(r)) {
                env.push((def.key.clone(), v.clone()));
            }
        }
        env
    }

    /// Run a shell command in a step container; (exit code, timed out, log tail).
    #[allow(clippy::too_many_arguments)]
    async fn exec(
        &mut self,
        step: &Step,
        n: u64,
        what: &str,
        command: &str,
        network: bool,
        access: Access,
        timeout: Option<Duration>,
    ) -> Result<(i64, bool, String), PipelineError> {
        let c = self
            .container(if network { Net::Open } else { Net::None }, access, step)
            .await?;
        let log = self
            .files
            .logs()
            .join(format!("{n:04}-{}-{what}.log", sanitize(&step.name)));
        let spec = ExecSpec {
            argv: vec!["bash".into(), "-c".into(), command.to_string()],
            working_dir: Some(WORKDIR.into()),
            env: self.step_env(step),
            timeout,
            log_path: log.clone(),
            log_limit: self.log_limit(),
        };
        let out = self
            .rt
            .exec(&c, &spec, &self.redactor, &NoopObserver)
            .await?;
        // Only the tail is read: a step's log can be gigabytes.
        let text = read_tail(&log, FEEDBACK_MAX as u64)
            .unwrap_or_else(|| format!("{}{}", out.stdout_tail, out.stderr_tail));
        self.event(Kind::Command, Some(&step.name), serde_json::json!({"what": what, "command": command, "exit_code": out.exit_code, "timed_out": out.timed_out,
            "duration_s": (out.duration.as_secs_f64() * 1000.0).round() / 1000.0, "log": log}))?;
        Ok((out.exit_code, out.timed_out, tail(&text, FEEDBACK_MAX)))
    }

    async fn setup(&mut self, step: &Step, n: u64) -> Result<Option<StepResult>, PipelineError> {
        let Some(setup) = step.setup.clone() else {
            return Ok(None);
        };
        let key = hex::encode(Sha256::digest(
            format!("{}\n{}\n{}", self.image, step.name, setup).as_bytes(),
        ));
        let stamp =
            self.state_dir
                .join("stamps")
                .join(format!("{}-{}", sanitize(&step.name), &key[..16]));
        if stamp.exists() && !self.refresh {
            self.event(
                Kind::SetupCached,
                Some(&step.name),
                serde_json::json!({"stamp": stamp}),
            )?;
            return Ok(None);
        }
        // Setup provisions (installs): it gets the network.
        let (code, timed_out, out) = self
            .exec(
                step,
                n,
                "setup",
                &setup,
                true,
                Access::Rw,
                step.timeout_s.map(Duration::from_secs),
            )
            .await?;
        if code != 0 || timed_out {
            return Ok(Some(StepResult {
                verdict: Verdict::Fail,
                detail: format!("setup failed:\n{out}"),
                exit_code: Some(code),
                missing_deps: vec![],
            }));
        }
        std::fs::create_dir_all(stamp.parent().unwrap_or(&self.state_dir))
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        belay_record::atomic_write(&stamp, setup.as_bytes())?;
        Ok(None)
    }

    async fn run_step(&mut self, step: &Step, n: u64) -> Result<StepResult, PipelineError> {
        self.hygiene(step)?;
        match &step.kind {
            StepKind::Command { command } => {
                if let Some(r) = self.setup(step, n).await? {
                    return Ok(r);
                }
                let (code, timed_out, out) = self
                    .exec(
                        step,
                        n,
                        "command",
                        command,
                        step.network,
                        step.workspace,
                        step.timeout_s.map(Duration::from_secs),
                    )
                    .await?;
                let verdict = if code == 0 && !timed_out {
                    Verdict::Pass
                } else {
                    Verdict::Fail
                };
                let detail = if timed_out {
                    format!("timed out after {}s\n{out}", step.timeout_s.unwrap_or(0))
                } else {
                    out
                };
                Ok(StepResult {
                    verdict,
                    detail,
                    exit_code: Some(code),
                    missing_deps: vec![],
                })
            }
            StepKind::Action { action } if action == "commit" => self.commit(step).await,
            StepKind::Action { .. } => {
                let script = step
                    .params
                    .get("script")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                let cmd = self.render(script, step);
                let (code, timed_out, out) = self
                    .exec(
                        step,
                        n,
                        "action",
                        &cmd,
                        step.network,
                        step.workspace,
                        step.timeout_s.map(Duration::from_secs),
                    )
                    .await?;
                Ok(StepResult {
                    verdict: if code == 0 && !timed_out {
                        Verdict::Pass
                    } else {
                        Verdict::Fail
                    },
                    detail: out,
                    exit_code: Some(code),
                    missing_deps: vec![],
                })
            }
            StepKind::Agent { agent } => self.agent(step, agent, n).await,
        }
    }

    /// `{subject}`, `{pipeline}`, `{run_id}` and `{<param>}` in a template.
    fn render(&self, template: &str, step: &Step) -> String {
        let subject = step
            .params
            .get("subject")
            .and_then(|v| v.as_str())
            .map(String::from)
            .unwrap_or_else(|| self.p.name.clone());
        let mut out = template
            .replace("{subject}", &subject)
            .replace("{pipeline}", &self.p.name)
            .replace("{run_id}", &self.state.run_id);
        for (k, v) in &step.params {
            if let Some(s) = v.as_str() {
                out = out.replace(&format!("{{{k}}}"), s);
            }
        }
        out
    }

    fn context(&self, step: &Step, prompt: &str) -> String {
        let mut s = prompt.to_string();
        s.push_str(&format!(
            "\n\n## Task context\nPipeline `{}`, step `{}`, attempt {} of {}. The workspace is {WORKDIR}; your changes there are kept. You cannot commit (git is read-only for you): the pipeline commits once every gate passes.\n",
            self.p.name, step.name, self.state.attempt, self.state.max_attempts
        ));
        if !step.produces.is_empty() {
            s.push_str(&format!(
                "Write these files: {}.\n",
                step.produces.join(", ")
            ));
        }
        if let (Some(a), Some(v)) = (&step.artifact, &step.verdicts) {
            let mut choices = format!("`VERDICT: {}` or `VERDICT: {}`", v.pass, v.fail);
            if let Some(u) = &v.unverifiable {
                choices.push_str(&format!(" (or `VERDICT: {u}` when it cannot be checked)"));
            }
            s.push_str(&format!(
                "Write your findings to `{a}`, ending with one line {choices}.\n"
            ));
        }
        s.push_str("\n## Dependency policy\n");
        match self.p.deps_policy {
            DepsPolicy::Locked => s.push_str(&format!(
                "You may only use dependencies already present in {}. If the work needs a dependency that is not there, declare it in your final answer under the header `## Missing dependencies` (one `name==version` per line), finish what you can, and do not add it to any manifest.\n",
                self.p.lockfiles.join(", ")
            )),
            DepsPolicy::Open => s.push_str("You may add dependencies as exact pins in the project's manifest; never run a package manager's `add` command.\n"),
        }
        let root = self.git.root();
        let pipeline_dir =
            std::fs::canonicalize(&self.p.dir).unwrap_or_else(|_| self.p.dir.clone());
        let prefix = pipeline_dir
            .strip_prefix(root)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for f in &self.p.additional_files {
            // Read through hostfs: a step may have swapped the file for a link.
            let rel = prefix.join(f).to_string_lossy().into_owned();
            if let Ok(Some(bytes)) = belay_sandbox::hostfs::read(root, &rel, 4 * SHARED_MAX as u64)
            {
                let text = self
                    .redactor
                    .redact(&String::from_utf8_lossy(&bytes))
                    .into_owned();
                s.push_str(&format!(
                    "\n## Shared file: {f}\n```\n{}\n```\n",
                    tail(&text, SHARED_MAX)
                ));
            }
        }
        if let Some(fb) = &self.state.feedback {
            s.push_str(&format!("\n## Previous attempt feedback\n{fb}\n"));
        }
        s
    }

    async fn agent(
        &mut self,
        step: &Step,
        agent: &str,
        n: u64,
    ) -> Result<StepResult, PipelineError> {
        let def = self
            .p
            .agents
            .get(agent)
            .cloned()
            .ok_or_else(|| PipelineError::Config(format!("agent `{agent}` is not loaded")))?;
        if def.runner != "builtin" {
            return self.cli_agent(step, &def, n).await;
        }
        let Some(client) = self.model.clone() else {
            return Err(PipelineError::Config(format!("step `{}` runs agent `{agent}`, which needs the pipeline's `llm` block (model, base_url, api_key_env)", step.name)));
        };
        let task = self.context(step, &def.prompt);
        let c = self
            .container(
                if step.network { Net::Open } else { Net::None },
                step.workspace,
                step,
            )
            .await?;
        let mut ws = ContainerWorkspace::new(
            self.rt.clone(),
            &c,
            WORKDIR,
            self.files
                .logs()
                .join(format!("{n:04}-{}-tools", sanitize(&step.name))),
            self.redactor.clone(),
            self.step_env(step),
        );
        if step.workspace == Access::Rw {
            ws = ws.with_host_mount(self.git.root().to_path_buf());
        }
        let config = BuiltinConfig {
            max_iterations: step.max_iterations.unwrap_or(30),
            wall_time: step.timeout_s.map(Duration::from_secs),
            instructions: Some(format!(
                "You are the `{}` agent of a gated pipeline.",
                def.name
            )),
            scrub: if self.p.llm.as_ref().is_none_or(|l| l.scrub_requests) {
                self.redactor.clone()
            } else {
                Redactor::default()
            },
            ..BuiltinConfig::default()
        };
        let mut agent_run = BuiltinAgent::new(&client, &ws, config);
        let mut live = LiveAgent::new(self.sink.clone(), &step.name);
        let report = agent_run.run(&task, &mut |e| live.push(e)).await;
        live.finish()?;
        let report = report.map_err(|e| PipelineError::Config(format!("agent `{agent}`: {e}")))?;
        self.event(
            Kind::AgentReport,
            Some(&step.name),
            serde_json::json!({"stop": report.stop, "turns": report.turns, "usage": report.usage,
            "files_changed": report.files_changed, "final_text": tail(&report.final_text, 4096)}),
        )?;
        self.agent_result(step, &report)
    }

    /// The commit point refused: the event, and a failing verdict that says why.
    fn refuse_commit(&mut self, step: &Step, reason: String) -> Result<StepResult, PipelineError> {
        self.event(
            Kind::CommitRefused,
            Some(&step.name),
            serde_json::json!({"reason": &reason}),
        )?;
        Ok(StepResult {
            verdict: Verdict::Fail,
            detail: reason,
            exit_code: None,
            missing_deps: vec![],
        })
    }

    /// The commit point: host side, hooks off, tooling and paperwork excluded,
    /// only when every gate of this attempt passed and the worktree was clean
    /// at start, and never with a secret's value in it.
    async fn commit(&mut self, step: &Step) -> Result<StepResult, PipelineError> {
        let fail = |detail: String| {
            Ok(StepResult {
                verdict: Verdict::Fail,
                detail,
                exit_code: None,
                missing_deps: vec![],
            })
        };
        if !self.state.clean_at_start {
            return fail("the worktree had uncommitted changes when the run started: belay does not mix them into its commit. Commit or stash them and start a new run".into());
        }
        let failed: Vec<&String> = self
            .state
            .verdicts
            .iter()
            .filter(|(_, v)| **v != Verdict::Pass)
            .map(|(k, _)| k)
            .collect();
        if !failed.is_empty() {
            return fail(format!(
                "gates that did not pass in this attempt: {}",
                failed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let root = self.git.root().to_path_buf();
        let mut exclude = tooling_paths(self.p, &root);
        for s in &self.p.steps {
            exclude.extend(s.produces.iter().cloned());
            exclude.extend(s.artifact.iter().cloned());
        }
        if let Some(before) = self.state.commit_pending.clone() {
            let head = self.git.head().await?;
            if head != before
                && self
                    .git
                    .resolve_commit(&format!("{head}~1"))
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|parent| parent == before)
            {
                self.state.commit = Some(head.clone());
                self.state.commit_pending = None;
                self.save()?;
                self.event(
                    Kind::Commit,
                    Some(&step.name),
                    serde_json::json!({"sha": head, "recovered": true}),
                )?;
                return Ok(StepResult {
                    verdict: Verdict::Pass,
                    detail: String::new(),
                    exit_code: None,
                    missing_deps: vec![],
                });
            }
            self.state.commit_pending = None;
        }
        let template = step
            .params
            .get("message")
            .and_then(|v| v.as_str())
            .unwrap_or("belay: {pipeline} ({run_id})")
            .to_string();
        let message = self
            .redactor
            .redact(&self.render(&template, step))
            .into_owned();
        // A step may not change the pipeline's tooling (the file, the agents,
        // the shared files, the policy files) and get the change committed.
        let tooling = tooling_paths(self.p, &root);
        let refs: Vec<&str> = tooling.iter().map(String::as_str).collect();
        let changed = self.git.dirty(&refs).await?;
        if !changed.is_empty() {
            let reason = format!("a step changed the pipeline's tooling ({}); nothing was committed. Restore it from HEAD and start a new run", changed.join(", "));
            return self.refuse_commit(step, reason);
        }
        // A nested `.git` that git does not ignore (inside a tracked directory,
        // where `ls-files --others` does not look): a person running git there
        // would run its config. Submodules of the start are theirs to have.
        let nested: Vec<String> = self
            .nested_git
            .iter()
            .map(|p| {
                p.trim_end_matches("/.git")
                    .trim_end_matches(".git")
                    .trim_end_matches('/')
                    .to_string()
            })
            .filter(|dir| !self.state.submodules_at_start.contains(dir))
            .collect();
        let nested = self.git.not_ignored(&nested).await?;
        if !nested.is_empty() {
            return self.refuse_commit(
                step,
                belay_vcs::Refusal::EmbeddedRepository(nested).to_string(),
            );
        }
        // git refuses a pathspec beyond a symbolic link: an output whose
        // parent a step made a link cannot be in the tree anyway.
        exclude.retain(|e| belay_sandbox::hostfs::parents_are_dirs(&root, e));
        let scanner = self.redactor.scanner();
        // A kill between the commit and the next save must not lose it: the
        // HEAD before is recorded first, and a resume recognises the commit.
        self.state.commit_pending = Some(self.git.head().await?);
        self.save()?;
        let submodules = self.state.submodules_at_start.clone();
        let outcome = self
            .git
            .commit_checked(belay_vcs::CommitRequest {
                message: message.clone(),
                author: None,
                exclude,
                submodules,
                scan: Box::new(move |_, r| scanner.scan(r)),
            })
            .await?;
        self.state.commit_pending = None;
        let committed = match outcome {
            belay_vcs::CommitOutcome::Committed(c) => c,
            belay_vcs::CommitOutcome::Nothing => {
                self.save()?;
                self.event(
                    Kind::Commit,
                    Some(&step.name),
                    serde_json::json!({"skipped": "nothing to commit"}),
                )?;
                return Ok(StepResult {
                    verdict: Verdict::Pass,
                    detail: "nothing to commit".into(),
                    exit_code: None,
                    missing_deps: vec![],
                });
            }
            belay_vcs::CommitOutcome::Refused(r) => {
                self.save()?;
                return self.refuse_commit(step, r.to_string());
            }
        };
        let sha = committed.sha;
        self.state.commit = Some(sha.clone());
        self.save()?;
        self.event(
            Kind::Commit,
            Some(&step.name),
            serde_json::json!({"sha": sha, "message": message, "files": cap_list(&committed.files), "files_total": committed.files_total}),
        )?;
        Ok(StepResult {
            verdict: Verdict::Pass,
            detail: String::new(),
            exit_code: None,
            missing_deps: vec![],
        })
    }
}

/// An agent's events, written to the run's log as they happen (a crash loses
/// none, and `belay runs events --follow` shows a running agent's turns).
struct LiveAgent {
    sink: EventSink,
    step: String,
    error: Option<belay_record::RecordError>,
}

impl LiveAgent {
    fn new(sink: EventSink, step: &str) -> Self {
        LiveAgent {
            sink,
            step: step.to_string(),
            error: None,
        }
    }

    fn push(&mut self, e: &AgentEvent) {
        if self.error.is_some() {
            return;
        }
        let data = serde_json::json!({ "event": e });
        if let Err(err) = self.sink.emit(
            Kind::Agent.source(),
            Some(&self.step),
            &Event {
                kind: Kind::Agent,
                data: &data,
            },
        ) {
            self.error = Some(err);
        }
    }

    fn finish(self) -> Result<(), PipelineError> {
        match self.error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// The last `max` bytes of a file (the log is written redacted).
fn read_tail(path: &Path, max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max))).ok()?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// A policy file: inside the workspace (where steps write) through hostfs (no
/// link, no FIFO, regular file), at most 1 MiB; outside it, plainly.
fn read_policy(path: &Path, root: &Path) -> Result<String, String> {
    const MAX: u64 = 1 << 20;
    let abs = std::fs::canonicalize(path.parent().unwrap_or(path))
        .map(|d| d.join(path.file_name().unwrap_or_default()))
        .unwrap_or_else(|_| path.to_path_buf());
    let bytes = match abs.strip_prefix(root) {
        Ok(rel) => belay_sandbox::hostfs::read(root, &rel.to_string_lossy(), MAX + 1)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{} does not exist", path.display()))?,
        Err(_) => {
            let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX + 1), &mut b)
                .map_err(|e| e.to_string())?;
            b
        }
    };
    if bytes.len() as u64 > MAX {
        return Err(format!("{} is larger than 1 MiB", path.display()));
    }
    String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))
}

/// At most 200 entries of a list, for an event (a commit of 200,000 files
/// must not make one event line of 50 MB).
fn cap_list(v: &[String]) -> &[String] {
    &v[..v.len().min(200)]
}

/// Fence an internal network: from its bridge, the host accepts only TCP to
/// `allowed` (belay's proxy or forwarder), nothing else.
fn fence(
    net: &str,
    info: &belay_sandbox::NetworkInfo,
    allowed: std::net::SocketAddr,
) -> Result<belay_sandbox::firewall::Firewall, PipelineError> {
    let bridge = info.bridge.as_deref().ok_or_else(|| {
        PipelineError::Infra(format!(
            "network {net} has no bridge interface belay can fence: remove it (`docker network rm {net}`) and rerun"
        ))
    })?;
    Ok(belay_sandbox::firewall::Firewall::lock(
        bridge,
        allowed.ip(),
        &[allowed.port()],
    )?)
}

/// Where the pinned agent CLIs are installed (scripts/setup-host.sh).
fn agents_dir() -> PathBuf {
    std::env::var_os("BELAY_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/belay-agents"))
}

/// The host's node binary, mounted into CLI containers (the CLIs are node programs).
fn host_node() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("node"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// The pins under a `## Missing dependencies` header.
pub fn missing_deps(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') {
            inside = t
                .trim_start_matches('#')
                .trim()
                .eq_ignore_ascii_case("missing dependencies");
            continue;
        }
        if inside {
            let pin = t.trim_start_matches(['-', '*', ' ']).trim();
            if !pin.is_empty() && !pin.eq_ignore_ascii_case("none") {
                out.push(pin.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_dependency_pins_are_read() {
        assert_eq!(
            missing_deps(
                "done.\n## Missing dependencies\n- requests==2.32.3\nflask==3.0\n\n## Notes\nx"
            ),
            vec!["requests==2.32.3", "flask==3.0"]
        );
        assert!(missing_deps("## Missing dependencies\nnone\n").is_empty());
        assert!(missing_deps("all good").is_empty());
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("2g"), Some(2 << 30));
        assert_eq!(parse_memory("512m"), Some(512 << 20));
        assert_eq!(parse_memory("x"), None);
    }
}
