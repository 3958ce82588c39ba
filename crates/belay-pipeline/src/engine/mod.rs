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
use belay_model::{Api, ClientConfig, ModelClient, PriceTable};
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

mod commit;
mod host;
mod sandbox;
mod steps;
#[cfg(test)]
mod tests;
mod util;

use host::*;
pub use host::{env_files, resolve_secrets, state_dir_for, tooling_paths};
pub use util::missing_deps;
use util::*;

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
    /// The model's key (for agent CLIs' endpoint), resolved with the client.
    model_key: Option<String>,
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

/// The pipeline's model client, and its key (name, value) for the redactor.
type ModelAndKey = (Option<ModelClient>, Option<(String, String)>);

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
        let model_key = key.as_ref().map(|(_, k)| k.clone());
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
            model_key,
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
        // The step graph, for a reader that draws it (the dashboard).
        let graph: Vec<serde_json::Value> = p
            .steps
            .iter()
            .map(|s| {
                let kind = match &s.kind {
                    StepKind::Agent { .. } => "agent",
                    StepKind::Command { .. } => "command",
                    StepKind::Action { .. } => "action",
                };
                serde_json::json!({"name": s.name, "kind": kind, "on_pass": s.on_pass.describe(),
                    "on_fail": s.on_fail.describe(), "on_unverifiable": s.on_unverifiable.describe()})
            })
            .collect();
        let data = serde_json::json!({"pipeline": p.path, "attempt": e.state.attempt, "max_attempts": e.state.max_attempts,
            "current": e.state.current, "clean_at_start": e.state.clean_at_start, "steps": graph});
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
            // The feedback the next attempt gets goes with the route.
            let feedback = (r.verdict != Verdict::Pass)
                .then(|| self.state.feedback.clone())
                .flatten();
            self.event(
                Kind::Route,
                Some(&name),
                serde_json::json!({"verdict": r.verdict, "to": route.describe(), "feedback": feedback}),
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
}
