//! The executor: steps in sandbox containers, gates, routing, state after
//! every transition, resume, and the one commit point.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belay_agent::builtin::BuiltinConfig;
use belay_agent::cli::Endpoint;
use belay_agent::session::EventTarget;
use belay_agent::{AgentSession, AgentSpec, Placement};
use belay_model::{Api, ClientConfig, ModelClient, ModelSetup, PriceTable};
use belay_record::{OpenRun, Redactor, RunHandle, RunLock};
use belay_sandbox::route::Route as NetRoute;
use belay_sandbox::{
    ContainerRuntime, ContainerSpec, ExecSpec, Mount, Network, NoopObserver, SandboxError,
};
use belay_vcs::Git;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::events::{Event, Kind};
use crate::schema::{Access, DepsPolicy, Pipeline, Route, Step, StepKind};
use crate::state::{RunState, Status, LLM_USAGE_FILE, LOGS_DIR, SUMMARY_FILE};
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
    #[error("agent {agent}: {source}")]
    Agent {
        agent: String,
        source: belay_agent::AgentError,
    },
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
            PipelineError::Agent { source, .. } => source.exit_class(),
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
    /// The run registry (default: the user's, `belay_record::state_home`).
    pub registry: Option<PathBuf>,
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
    let canon = fs_err::canonicalize(&p.path).unwrap_or_else(|_| p.path.clone());
    let h = hex::encode(Sha256::digest(canon.to_string_lossy().as_bytes()));
    belay_record::state_home()
        .join("pipelines")
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
        let abs = fs_err::canonicalize(x).unwrap_or_else(|_| x.to_path_buf());
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
    let mut hits: Vec<String> = fs_err::read_dir(root)
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
    let bytes = fs_err::read(path).map_err(|e| {
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
    let status = fs_err::read_to_string("/proc/self/status").ok()?;
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
    run: RunHandle,
    state: RunState,
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
    egress: Option<NetRoute>,
    /// The run's own bridge for `network: true` steps without presets: the
    /// internet, but not the host's services.
    open_net: Option<(String, belay_sandbox::firewall::Firewall)>,
    /// The seccomp profile, read and hashed once at the start: (path, text, sha256).
    seccomp: Option<(PathBuf, String, String)>,
    model_route: Option<NetRoute>,
    model: Option<ModelClient>,
    image: String,
    state_dir: PathBuf,
    refresh: bool,
    _lock: RunLock,
    /// Nested `.git` entries the last end-of-step walk found.
    nested_git: Vec<String>,
    /// Tokens and cost of the agents so far (for the run registry).
    tokens: u64,
    cost_usd: f64,
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
    if let Ok(sd) = fs_err::canonicalize(state_dir) {
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
        fs_err::create_dir_all(&state_dir).map_err(|e| {
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
        let state = match &opts.resume {
            Some(id) => {
                belay_record::run_id::validate(id)
                    .map_err(|e| PipelineError::Config(e.to_string()))?;
                let dir = state_dir.join("runs").join(id);
                let mut st: RunState = RunHandle::load_state(&dir)?.ok_or_else(|| {
                    PipelineError::Config(format!(
                        "no run {id} to resume (no {}); `belay runs list --mode pipeline` lists runs",
                        dir.join(belay_record::STATE_FILE).display(),
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
                st
            }
            None => {
                let id = belay_record::run_id::generate(&sanitize(&p.name));
                RunState {
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
                }
            }
        };
        let run_dir = state_dir.join("runs").join(&state.run_id);
        let (model, key) = model_client(p, run_dir.join(LLM_USAGE_FILE))?;
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
        // Every run of every mode is opened the one way: its directory, its
        // lock, its event log and its place in the user's registry.
        let run = RunHandle::open(OpenRun {
            dir: run_dir,
            id: &state.run_id,
            mode: belay_record::Mode::Pipeline,
            title: Some(&p.name),
            redactor: redactor.clone(),
            registry: opts
                .registry
                .as_deref()
                .map(belay_record::Registry::at)
                .unwrap_or_else(belay_record::Registry::default_location),
        })?;
        let logs = run.path(LOGS_DIR);
        fs_err::create_dir_all(&logs).map_err(|e| {
            PipelineError::Config(format!(
                "cannot create {}: {e}. Pass --state-dir with a writable directory",
                logs.display()
            ))
        })?;
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
            run,
            state,
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
            nested_git: Vec::new(),
            tokens: 0,
            cost_usd: 0.0,
        };
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
        self.run.dir()
    }

    fn save(&mut self) -> Result<(), PipelineError> {
        self.state.updated_at = belay_record::now_rfc3339();
        self.run.save_state(&self.state)?;
        Ok(())
    }

    fn event(
        &mut self,
        kind: Kind,
        step: Option<&str>,
        data: serde_json::Value,
    ) -> Result<(), PipelineError> {
        self.run
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
        if let Some(route) = self.egress.take() {
            let net = route.network.clone();
            drop(route);
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
            duration_s: self.run.elapsed_s(),
            tokens: self.tokens,
            cost_usd: self.cost_usd,
            summary: self.state.failure.clone(),
        };
        self.run.finish(end);
        let outcome = Outcome {
            run_id: self.state.run_id.clone(),
            status: self.state.status,
            commit: self.state.commit.clone(),
            failure: self.state.failure.clone(),
            run_dir: self.run.dir().to_path_buf(),
            attempts: self.state.attempt,
            step_runs: self.state.step_runs,
            duration_s: self.run.elapsed_s(),
            peak_rss_bytes: peak_rss_bytes(),
        };
        self.run.write_json(SUMMARY_FILE, &outcome)?;
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
                .map(NetRoute::drain_decisions)
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
        if let Some(r) = &self.egress {
            return Ok((r.network.clone(), r.url.clone()));
        }
        let net = format!("belay-{}-egress", self.state.run_id);
        let allow = belay_sandbox::egress::package_registries();
        let route =
            belay_sandbox::route::egress_route(self.rt.as_ref(), &net, allow.clone()).await?;
        self.event(Kind::EgressProxy, None, serde_json::json!({"network": &net, "proxy": &route.url, "presets": &self.p.egress.presets, "allowed_hosts": &allow.hosts, "allowed_ports": &allow.ports,
            "firewall": route.firewall_chain()}))?;
        let out = (route.network.clone(), route.url.clone());
        self.egress = Some(route);
        Ok(out)
    }

    /// The route from an agent CLI's container to the model endpoint (made on
    /// first use): an internal network, and on the host either a TCP forwarder
    /// to a loopback endpoint or a proxy that allows only the endpoint's host.
    async fn model_route(&mut self) -> Result<&NetRoute, PipelineError> {
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
            let net = format!("belay-{}-model", self.state.run_id);
            let route = belay_sandbox::route::model_route(self.rt.as_ref(), &net, &base).await?;
            let host = belay_sandbox::egress::url_host(&base);
            let data = serde_json::json!({"network": &route.network, "base_url_in_container": &route.url, "endpoint_host": host});
            self.event(Kind::ModelRoute, None, data)?;
            self.model_route = Some(route);
        }
        self.model_route
            .as_ref()
            .ok_or_else(|| PipelineError::Infra("no model route".into()))
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
        let log = self.run.path(LOGS_DIR).join("image-probe.log");
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
            let view = self.run.path("git-config.sandbox");
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
            fs_err::create_dir_all(&host).map_err(|e| {
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
            // The CLIs every agent of the pipeline runs, read-only.
            for def in self.p.agents.values() {
                for m in belay_agent::session::container_mounts(&agent_spec(def)?)
                    .map_err(|e| PipelineError::Config(format!("agent `{}`: {e}", def.name)))?
                {
                    if !mounts.iter().any(|x| x.container == m.container) {
                        mounts.push(m);
                    }
                }
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
            .run
            .path(LOGS_DIR)
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
        fs_err::create_dir_all(stamp.parent().unwrap_or(&self.state_dir))
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
        let pipeline_dir = fs_err::canonicalize(&self.p.dir).unwrap_or_else(|_| self.p.dir.clone());
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

    /// An agent step, through the one agent service: the built-in agent or a
    /// CLI, in the step's container (a CLI's network limited to the model
    /// endpoint), belay's limits, its events in the log as they happen.
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
        let mut spec = agent_spec(&def)?;
        let task = self.context(step, &def.prompt);
        let (placement, endpoint, prices, final_grace) = if spec.is_builtin() {
            if self.model.is_none() {
                return Err(PipelineError::Config(format!("step `{}` runs agent `{agent}`, which needs the pipeline's `llm` block (model, base_url, api_key_env)", step.name)));
            }
            let net = if step.network { Net::Open } else { Net::None };
            let c = self.container(net, step.workspace, step).await?;
            let placement = Placement::Container {
                rt: self.rt.clone(),
                id: c,
                workdir: WORKDIR.into(),
                env: self.step_env(step),
                host_root: (step.workspace == Access::Rw).then(|| self.git.root().to_path_buf()),
            };
            (placement, None, None, Duration::from_secs(5))
        } else {
            let llm = self.p.llm.clone().ok_or_else(|| {
                PipelineError::Config(format!(
                    "agent `{}` needs the pipeline's `llm` block",
                    def.name
                ))
            })?;
            spec.model.get_or_insert_with(|| llm.model.clone());
            let key = std::env::var(key_env_of(&llm))
                .ok()
                .filter(|k| !k.is_empty());
            let base = self.model_route().await?.url.clone();
            let c = self.container(Net::Model, step.workspace, step).await?;
            let endpoint = Endpoint {
                base_url: base,
                api: llm.api.unwrap_or(Api::Responses),
                key: key.map(belay_model::Secret::new),
            };
            let prices = PriceTable::builtin().lookup(spec.model.as_deref().unwrap_or(""));
            let placement = Placement::Container {
                rt: self.rt.clone(),
                id: c,
                workdir: WORKDIR.into(),
                env: self.step_env(step),
                host_root: None,
            };
            (placement, Some(endpoint), prices, Duration::from_secs(10))
        };
        let client = self.model.clone();
        let session = AgentSession {
            spec,
            placement,
            limits: belay_agent::Limits {
                max_turns: Some(step.max_iterations.unwrap_or(30)),
                wall_time: step.timeout_s.map(Duration::from_secs),
                final_grace,
                ..belay_agent::Limits::default()
            },
            client: client.as_ref(),
            builtin: BuiltinConfig {
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
            },
            endpoint,
            prices,
            // The container is the sandbox: the CLI's own approvals would only stall it.
            auto_approve: true,
            logs: self
                .run
                .path(LOGS_DIR)
                .join(format!("{n:04}-{}-tools", sanitize(&step.name))),
            redactor: self.redactor.clone(),
            events: Some(EventTarget {
                sink: self.run.sink().clone(),
                step: Some(step.name.clone()),
                source: Kind::Agent.source(),
            }),
        };
        let report = session
            .run(&task)
            .await
            .map_err(|source| PipelineError::Agent {
                agent: format!("{} ({})", def.name, def.runner),
                source,
            })?;
        self.event(Kind::AgentReport, Some(&step.name), serde_json::json!({"runner": &def.runner, "stop": report.stop, "turns": report.turns, "usage": report.usage,
            "cost_usd": report.cost_usd, "files_changed": report.files_changed, "exit_code": report.exit_code, "final_text": tail(&report.final_text, 4096), "stderr_tail": tail(&report.stderr_tail, 2048)}))?;
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
    let abs = fs_err::canonicalize(path.parent().unwrap_or(path))
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

/// An agent file's spec: its `runner` (the one agent spec syntax), with the
/// file's `model` when the runner names none.
fn agent_spec(def: &crate::schema::AgentDef) -> Result<AgentSpec, PipelineError> {
    let mut spec: AgentSpec = def
        .runner
        .parse()
        .map_err(|e| PipelineError::Config(format!("{}: runner: {e}", def.path.display())))?;
    if spec.model.is_none() {
        spec.model = def.model.clone();
    }
    Ok(spec)
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
