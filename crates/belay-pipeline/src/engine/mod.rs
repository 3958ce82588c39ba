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
use belay_record::{NoObserver, Observer, OpenRun, Redactor, RunHandle, RunLock};
use belay_sandbox::route::Route as NetRoute;
use belay_sandbox::{
    ContainerRuntime, ContainerSpec, ExecSpec, Mount, Network, NoopObserver, SandboxError,
};
use belay_vcs::Git;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::events::{Budget, Kind, PipelineEvent, RunStart, StepNode};
use crate::schema::{Access, DepsPolicy, OpenNet, Pipeline, Route, Step, StepKind};
use crate::state::{Exhausted, RunState, Status, LLM_USAGE_FILE, LOGS_DIR, SUMMARY_FILE};
use crate::verdict::{self, Verdict};

mod artifacts;
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
pub const WORKDIR: &str = belay_sandbox::layout::REPO;
/// Where the run's artifacts (`artifact:`, `produces:`) are inside step
/// containers: the run's own directory, outside the worktree, writable by
/// every step (a read-only reviewer too).
pub const ARTIFACTS: &str = belay_sandbox::layout::ARTIFACTS;
/// The run directory's folder of artifacts.
pub const ARTIFACTS_DIR: &str = "artifacts";
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
    /// The sandbox failed under a running step (the engine refused an exec,
    /// the container is gone): exit 3, no retry.
    #[error("{0}")]
    SandboxFailed(String),
    /// SIGINT or SIGTERM: the step was stopped and recorded, the run can be
    /// resumed: exit 130.
    #[error("{0}")]
    Interrupted(String),
    /// A run that cannot be resumed as asked: exit 2.
    #[error("{0}")]
    Resume(String),
    /// The workspace is not ready for a run (tooling, `.env`, the state
    /// directory, belay inside it): exit 2.
    #[error("{0}")]
    NotReady(String),
    /// A secret or the model's key is missing: exit 2.
    #[error("{0}")]
    MissingSecret(String),
    /// Another run of the pipeline holds its lock: exit 2.
    #[error("{0}")]
    Locked(String),
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
            PipelineError::Infra(_) | PipelineError::SandboxFailed(_) => ExitClass::Infra,
            PipelineError::Failed(_) => ExitClass::Failed,
            PipelineError::Interrupted(_) => ExitClass::Interrupted,
            PipelineError::Resume(_)
            | PipelineError::NotReady(_)
            | PipelineError::MissingSecret(_)
            | PipelineError::Locked(_) => ExitClass::Usage,
        }
    }

    fn error_code(&self) -> &'static str {
        match self {
            PipelineError::Sandbox(e) => e.error_code(),
            PipelineError::Record(e) => e.error_code(),
            PipelineError::Vcs(e) => e.error_code(),
            PipelineError::Agent { source, .. } => match source.exit_class() {
                belay_record::ExitClass::Failed => "BELAY-E201",
                c => c.error_code(),
            },
            PipelineError::Infra(_) => "BELAY-E303",
            PipelineError::SandboxFailed(_) => "BELAY-E302",
            PipelineError::Resume(_) => "BELAY-E104",
            PipelineError::NotReady(_) => "BELAY-E103",
            PipelineError::MissingSecret(_) => "BELAY-E102",
            PipelineError::Locked(_) => "BELAY-E105",
            e => belay_record::Classify::exit_class(e).error_code(),
        }
    }
}

#[derive(Clone, Default)]
pub struct RunOptions {
    pub resume: Option<String>,
    pub max_attempts: Option<u32>,
    /// Re-run every `setup:` (ignore the stamps).
    pub refresh: bool,
    pub state_dir: Option<PathBuf>,
    /// The run registry (default: the user's, `belay_record::state_home`).
    pub registry: Option<PathBuf>,
    /// A stop request (the reason), e.g. from SIGINT/SIGTERM: the current
    /// step is stopped and recorded as interrupted, the containers are
    /// removed, and `--resume` continues it.
    pub stop: Option<belay_record::Stop>,
    /// Told every event as it is recorded (the console).
    pub observer: Option<Arc<dyn Observer<PipelineEvent>>>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("resume", &self.resume)
            .field("max_attempts", &self.max_attempts)
            .field("refresh", &self.refresh)
            .field("state_dir", &self.state_dir)
            .field("registry", &self.registry)
            .field("stop", &self.stop.is_some())
            .field("observer", &self.observer.is_some())
            .finish()
    }
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
    /// `network: true`: the run's bridge, or the egress proxy (presets, or
    /// the browser class).
    Open(OpenNet),
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
    env_volumes: Option<belay_sandbox::envimage::EnvVolumes>,
    /// The internal networks and the proxies of networked steps with an
    /// egress policy (presets, the browser class), made on first use.
    egress: Vec<(OpenNet, NetRoute)>,
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
    stop: Option<belay_record::Stop>,
    observer: Option<Arc<dyn Observer<PipelineEvent>>>,
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
            belay_record::RecordError::Locked { .. } => PipelineError::Locked(format!(
                "another belay run of this pipeline is in progress (lock {}); wait for it to finish",
                state_dir.join("pipeline.lock").display()
            )),
            other => other.into(),
        })?;
        let (git, dirty, secrets) = host_checks(p, &state_dir).await?;
        let clean = dirty.is_empty();
        let mut resumed_budget = None;
        let pipeline_hash = hash_file(&p.path)?;
        let now = belay_record::now_rfc3339();
        let state = match &opts.resume {
            Some(id) => resume_state(p, &state_dir, id, &pipeline_hash, opts, &mut resumed_budget)?,
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
                    git_guard: p.isolation.allow_git_mutations.then(|| git.guard_git_dir()),
                    started_at: now.clone(),
                    updated_at: now,
                    exhausted: None,
                }
            }
        };
        let run_dir = state_dir.join("runs").join(&state.run_id);
        let (model, key) = model_client(p, run_dir.join(LLM_USAGE_FILE))?;
        // The pipeline's own secrets (their names label what is redacted),
        // then the one policy's host part (proxies, URL credentials,
        // secret-looking variables, model keys).
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
        redactor.extend_from(&belay_sandbox::trust::host_redactor());
        // The image, and what it can run, before the run is recorded: a run
        // refused here leaves nothing to resume.
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
        refuse_steps_the_image_cannot_run(p, rt.as_ref(), &image, &state.run_id, &redactor).await?;
        // Every run of every mode is opened the one way: its directory, its
        // lock, its event log and its place in the user's registry.
        let run = RunHandle::open(OpenRun {
            dir: run_dir,
            id: &state.run_id,
            mode: belay_record::Mode::Pipeline,
            title: Some(&p.name),
            repo: None,
            redactor: redactor.clone(),
            registry: opts
                .registry
                .as_deref()
                .map(belay_record::Registry::at)
                .unwrap_or_else(belay_record::Registry::default_location),
        })?;
        for dir in [LOGS_DIR, ARTIFACTS_DIR] {
            let dir = run.path(dir);
            fs_err::create_dir_all(&dir).map_err(|e| {
                PipelineError::Config(format!(
                    "cannot create {}: {e}. Pass --state-dir with a writable directory",
                    dir.display()
                ))
            })?;
        }
        // Containers a killed run left behind.
        let _ = belay_sandbox::reaper::reap_orphans(rt.as_ref()).await;
        let seccomp = seccomp_profile(p, git.root())?;
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
            egress: Vec::new(),
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
            stop: opts.stop.clone(),
            observer: opts.observer.clone(),
        };
        e.announce(opts.resume.is_some(), resumed_budget, &dirty)?;
        e.save()?;
        Ok(e)
    }

    /// The run's first events: its step graph (for a reader that draws it,
    /// the dashboard) and what was untracked at the start.
    fn announce(
        &mut self,
        resumed: bool,
        resumed_budget: Option<(u32, u32)>,
        dirty: &[String],
    ) -> Result<(), PipelineError> {
        // The step graph, for a reader that draws it (the dashboard).
        let steps: Vec<StepNode> = self
            .p
            .steps
            .iter()
            .map(|s| StepNode {
                name: s.name.clone(),
                kind: match &s.kind {
                    StepKind::Agent { .. } => "agent",
                    StepKind::Command { .. } => "command",
                    StepKind::Action { .. } => "action",
                },
                on_pass: s.on_pass.describe(),
                on_fail: s.on_fail.describe(),
                on_unverifiable: s.on_unverifiable.describe(),
            })
            .collect();
        let start = RunStart {
            pipeline: self.p.path.clone(),
            attempt: self.state.attempt,
            max_attempts: self.state.max_attempts,
            current: self.state.current.clone(),
            clean_at_start: self.state.clean_at_start,
            steps,
            budget: resumed_budget.map(|(before, now)| Budget {
                max_attempts_before: before,
                max_attempts: now,
            }),
        };
        self.event(
            None,
            if resumed {
                PipelineEvent::RunResumed(start)
            } else {
                PipelineEvent::RunStarted(start)
            },
        )?;
        if !resumed && !dirty.is_empty() {
            self.event(
                None,
                PipelineEvent::UntrackedAtStart {
                    files: cap_list(dirty).to_vec(),
                    files_total: dirty.len(),
                    hint: "the commit point refuses to mix these into its commit: commit or stash them, .gitignore build output, or list it in sync_excludes",
                },
            )?;
        }
        Ok(())
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

    /// Record an event and tell the observer.
    fn event(&mut self, step: Option<&str>, e: PipelineEvent) -> Result<(), PipelineError> {
        let obs: &dyn Observer<PipelineEvent> = match &self.observer {
            Some(o) => &**o,
            None => &NoObserver,
        };
        self.run.emit_to(e.kind().source(), step, &e, obs)?;
        Ok(())
    }

    /// Run until success or failure.
    pub async fn run(mut self) -> Result<Outcome, PipelineError> {
        let result = self.drive().await;
        for (_, c) in self.containers.drain() {
            let _ = self.rt.remove(&c).await;
        }
        // The empty mount points the engine made in the work tree.
        if let Some(v) = &self.env_volumes {
            v.tidy(self.git.root());
        }
        if let Some(route) = self.model_route.take() {
            route.close(self.rt.as_ref()).await;
        }
        for (_, route) in std::mem::take(&mut self.egress) {
            route.close(self.rt.as_ref()).await;
        }
        if let Some((net, fence)) = self.open_net.take() {
            drop(fence);
            let _ = self.rt.remove_network(&net).await;
        }
        // A finished run drops its environment volumes; an interrupted one
        // keeps them for its resume.
        if self.state.status != Status::Running {
            if let Some(v) = self.env_volumes.take() {
                v.remove(self.rt.as_ref()).await;
            }
        }
        if let Err(e) = &result {
            // A stop, a config or engine error mid-run: the run can be
            // resumed, and the registry says so.
            let _ = self.event(
                None,
                PipelineEvent::RunInterrupted {
                    error: e.to_string(),
                },
            );
            self.run.interrupted(belay_record::RunEnd {
                ok: false,
                duration_s: self.run.elapsed_s(),
                tokens: self.tokens,
                cost_usd: self.cost_usd,
                summary: Some(self.run.redactor().redact(&e.to_string()).into_owned()),
            });
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
                Some(&name),
                PipelineEvent::StepStart {
                    n,
                    attempt: self.state.attempt,
                    step_kind: step.kind.clone(),
                },
            )?;
            let t = Instant::now();
            let r = match self.stop.clone() {
                Some(stop) => stop
                    .race(self.run_step(&step, n))
                    .await
                    .unwrap_or_else(|why| Err(PipelineError::Interrupted(why.0))),
                None => self.run_step(&step, n).await,
            };
            let took = t.elapsed().as_secs_f64();
            let r = match r {
                Err(PipelineError::Interrupted(why)) => {
                    // The step starts again on `--resume`; its processes end below.
                    self.event(
                        Some(&name),
                        PipelineEvent::StepInterrupted {
                            n,
                            reason: why.clone(),
                            after_s: (took * 1000.0).round() / 1000.0,
                        },
                    )?;
                    Err(PipelineError::Interrupted(format!(
                        "{why}: step `{name}` was stopped and recorded, its containers removed; continue with `belay run {} --resume {}`",
                        self.p.path.display(),
                        self.state.run_id
                    )))
                }
                r => r,
            };
            // The end of a step happens even when it failed to run (and
            // its own failure is the one reported).
            let ended = self.end_step_processes(&name).await;
            let r = r?;
            ended?;
            self.collect_outputs(&step)?;
            self.scrub_outputs(&step)?;
            let decisions: Vec<_> = self
                .egress
                .iter()
                .flat_map(|(_, r)| r.drain_decisions())
                .collect();
            for d in decisions {
                self.event(Some(&name), PipelineEvent::Egress(d))?;
            }
            self.event(
                Some(&name),
                PipelineEvent::StepEnd {
                    n,
                    verdict: r.verdict,
                    exit_code: r.exit_code,
                    duration_s: (took * 1000.0).round() / 1000.0,
                },
            )?;
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
                Some(&name),
                PipelineEvent::Route {
                    verdict: r.verdict,
                    to: route.describe(),
                    feedback,
                },
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
                                "all {} attempts used; the last failing gate was `{name}` (continue with --resume {} --max-attempts N)",
                                self.state.max_attempts, self.state.run_id
                            );
                            self.state.exhausted = Some(Exhausted {
                                step: name.clone(),
                                next,
                            });
                            return self.finish(Status::Failed, Some(why));
                        }
                        self.state.attempt += 1;
                        self.state.verdicts.clear();
                        let a = self.state.attempt;
                        let max_attempts = self.state.max_attempts;
                        self.event(
                            None,
                            PipelineEvent::Attempt {
                                attempt: a,
                                max_attempts,
                            },
                        )?;
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
        let (attempts, step_runs) = (self.state.attempt, self.state.step_runs);
        self.event(
            None,
            PipelineEvent::RunEnd {
                status,
                failure,
                commit,
                attempts,
                step_runs,
            },
        )
    }
}

/// The state of the run `id` to resume: the same pipeline file, a run that
/// was interrupted or that used its attempts (given more).
fn resume_state(
    p: &Pipeline,
    state_dir: &std::path::Path,
    id: &str,
    pipeline_hash: &str,
    opts: &RunOptions,
    resumed_budget: &mut Option<(u32, u32)>,
) -> Result<RunState, PipelineError> {
    belay_record::run_id::validate(id).map_err(|e| PipelineError::Resume(e.to_string()))?;
    let dir = state_dir.join("runs").join(id);
    let mut st: RunState = RunHandle::load_state(&dir)?.ok_or_else(|| {
        PipelineError::Resume(format!(
            "no run {id} to resume (no {}); `belay runs list --mode pipeline` lists runs",
            dir.join(belay_record::STATE_FILE).display(),
        ))
    })?;
    if st.pipeline_hash != pipeline_hash {
        return Err(PipelineError::Resume(format!(
                "run {id} was started with a different {}: resume needs the same pipeline file (start a new run instead)",
                p.path.display()
            )));
    }
    match (st.status, st.exhausted.clone(), opts.max_attempts) {
        (Status::Running, _, n) => {
            if let Some(n) = n {
                *resumed_budget = Some((st.max_attempts, n));
                st.max_attempts = n;
            }
        }
        // An exhausted run continues with a larger budget: the
        // retry route it could not take, with its feedback.
        (Status::Failed, Some(ex), Some(n)) if n > st.attempt => {
            *resumed_budget = Some((st.max_attempts, n));
            st.max_attempts = n;
            st.status = Status::Running;
            st.attempt += 1;
            st.verdicts.clear();
            st.current = Some(ex.next.clone());
            st.failure = None;
            st.exhausted = None;
        }
        (Status::Failed, Some(_), Some(n)) => {
            return Err(PipelineError::Resume(format!(
                    "run {id} used {} attempt(s); --max-attempts {n} gives it none more. Pass a larger number",
                    st.attempt
                )));
        }
        (Status::Failed, Some(_), None) => {
            return Err(PipelineError::Resume(format!(
                    "run {id} used all {} attempts; continue it with a larger budget: --resume {id} --max-attempts N (N > {})",
                    st.max_attempts, st.attempt
                )));
        }
        (status, _, _) => {
            return Err(PipelineError::Resume(format!(
                    "run {id} already ended ({}{}); only an interrupted run, or one that used all its attempts, can be resumed",
                    match status {
                        Status::Succeeded => "succeeded",
                        _ => "failed",
                    },
                    st.failure
                        .as_ref()
                        .map(|f| format!(": {f}"))
                        .unwrap_or_default()
                )));
        }
    }
    Ok(st)
}

/// The step containers' seccomp profile: (path, text, hash), when one is set.
fn seccomp_profile(
    p: &Pipeline,
    root: &std::path::Path,
) -> Result<Option<(PathBuf, String, String)>, PipelineError> {
    Ok(match &p.isolation.seccomp_profile {
        Some(f) if f.starts_with(belay_sandbox::seccomp::PREFIX) => {
            let text = match belay_sandbox::seccomp::parse(f) {
                Ok(belay_sandbox::seccomp::ProfileRef::Bundled(_, text)) => text.to_string(),
                Ok(_) | Err(_) => {
                    return Err(PipelineError::Config(format!(
                        "isolation.seccomp_profile {f}: not a profile belay ships"
                    )))
                }
            };
            let hash = hex::encode(Sha256::digest(text.as_bytes()));
            Some((PathBuf::from(f), text, hash))
        }
        Some(f) => {
            let path = p.dir.join(f);
            let text = read_policy(&path, root).map_err(|e| {
                PipelineError::Config(format!("isolation.seccomp_profile {f}: {e}. Give the path of a seccomp JSON profile (a regular file of at most 1 MiB), relative to the pipeline file"))
            })?;
            let hash = hex::encode(Sha256::digest(text.as_bytes()));
            Some((path, text, hash))
        }
        None => None,
    })
}

/// A command step whose program the image lacks (`python3 -m pytest` in the
/// base image) would fail every attempt: refused before the run starts, with
/// the way to an image that has the project's environment. A step with a
/// `setup:` may install what it runs, and a script or a command with a
/// fallback may cope: they are not judged; nor is a program belay does not
/// probe for.
async fn refuse_steps_the_image_cannot_run(
    p: &Pipeline,
    rt: &dyn ContainerRuntime,
    image: &str,
    run_id: &str,
    redactor: &Redactor,
) -> Result<(), PipelineError> {
    let commands: Vec<(&str, &str)> = p
        .steps
        .iter()
        .filter(|s| s.setup.is_none())
        .filter_map(|s| match &s.kind {
            crate::schema::StepKind::Command { command } => {
                Some((s.name.as_str(), command.as_str()))
            }
            _ => None,
        })
        // A script (several lines, `;`) or a command with a fallback (`||`)
        // may well cope without the program: only a plain command, or a
        // chain of them with `&&`, is judged.
        .filter(|(_, c)| !c.trim().contains(['\n', ';']) && !c.contains("||"))
        .collect();
    // No probe (a container) for commands belay could not judge anyway.
    let judged = commands
        .iter()
        .any(|(_, c)| belay_sandbox::envimage::probed_programs(c).next().is_some());
    if !judged {
        return Ok(());
    }
    let env =
        belay_sandbox::envimage::RunEnv::open(rt, image, run_id, WORKDIR, redactor, true).await?;
    for (name, command) in commands {
        if let Some(prog) = env.lacking(command) {
            return Err(PipelineError::Config(format!(
                "step {name}: its command `{command}` runs `{prog}`, which the image {image} does not have: build the project's environment with `belay env build --repo {}` (a pipeline without isolation.image then runs in it), set isolation.image to one that has {prog}, or give the step a `setup:` that installs it",
                p.path.parent().map(|d| d.display().to_string()).unwrap_or_else(|| ".".into())
            )));
        }
    }
    Ok(())
}
