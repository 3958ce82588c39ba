//! `belay env build`: the checkpointed block loop.
//!
//! 1. Analyse the repository; resolve the base image (given, built from a
//!    Dockerfile through the Engine API, or the default).
//! 2. Copy the repository into a container from the base image, run the
//!    container preflight (`runtime_notes`), plan (or reuse the run's
//!    `blocks/*.json`), and commit the workspace as the first checkpoint.
//! 3. Run each block and its validation; after each success commit a
//!    checkpoint `<prefix>:<run>-<NNN>-<block>-success`. A failing block is
//!    repaired ([`recover`]) from its baseline checkpoint and replayed.
//! 4. Finalize: the clean replay ([`replay`]) when repairs changed the scripts,
//!    the final tag, the Dockerfile, the oracle.
//!
//! Checkpoints are also a cache: a block whose parent image and script match an
//! earlier checkpoint on the same engine reuses it without running.
//!
//! State (manifest, blocks, executions) is written atomically after every
//! transition, so rerunning the same command with the same run id after a crash
//! resumes from the last checkpoint that still exists on the engine.

mod recover;
mod replay;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belay_record::{run_id, write_json_atomic, JsonlAppender, OpenRun, Redactor, RunHandle};
use belay_sandbox::reaper::reap_orphans;
use belay_sandbox::trust::HostTrust;
use belay_sandbox::{
    bootstrap::DEFAULT_BASE_IMAGE, labels, BuildRequest, ContainerRuntime, ContainerSpec,
    ExecOutcome, ExecSpec, Network, NoopObserver, SandboxError, TarFilter,
};

use crate::ablation::{Ablation, Granularity};
use crate::analyze::{analyze, RepoContext};
use crate::manifest::{
    CacheStats, Checkpoint, Execution, LlmUsage, Manifest, OracleCommandResult, OracleReport,
};
use crate::plan::{plan_rules, Block, BlockStatus, BlockTiming, REPO_DIR, SCRIPTS_DIR};
use crate::preflight::{self, RuntimeNotes};
use crate::progress::{BlockOutput, BuildEvent, BuildObserver};
use crate::rundir::RunDir;
use crate::{cache, dockerfile, oracle, script, EnvError};

/// A commit faster than this means the container's writable layer is small
/// enough to keep using it (about what starting a fresh container costs).
const KEEP_CONTAINER_BELOW: Duration = Duration::from_millis(250);

/// Label on checkpoint images: the base image the run started from.
pub const BASE_LABEL: &str = "belay.base";
/// Label on checkpoint images: success | repaired | clean-replay.
pub const CHECKPOINT_KIND_LABEL: &str = "belay.checkpoint";

/// Where the base image comes from.
#[derive(Debug, Clone)]
pub enum BaseSpec {
    /// [`DEFAULT_BASE_IMAGE`], built offline by `belay image bootstrap`.
    Default,
    Image(String),
    Dockerfile(PathBuf),
}

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub repo: PathBuf,
    /// Defaults to `<repo>/.belay`.
    pub state_dir: Option<PathBuf>,
    pub run_id: Option<String>,
    pub image_prefix: String,
    pub base: BaseSpec,
    pub command_timeout: Duration,
    pub docker_build_timeout: Duration,
    pub keep_container: bool,
    pub oracle_file: Option<PathBuf>,
    pub oracle_timeout: Duration,
    /// Rewrite pytest oracle commands to `--collect-only` (never done silently).
    pub oracle_collect_only: bool,
    pub resume_from: Option<String>,
    pub start_at_block: Option<String>,
    /// Network of the build container (package installs need one).
    pub network: Network,
    /// Inherit the host's CA bundle and proxy settings.
    pub host_trust: bool,
    /// Secrets to scrub from everything written.
    pub redactor: Redactor,
    pub ablation: Ablation,
    pub max_repair_attempts: u32,
    pub max_probe_failures: u32,
    /// Reuse matching checkpoints of earlier builds on the same engine.
    pub cache: bool,
    /// Replay the final scripts even when the forward run already was one.
    pub force_clean_replay: bool,
    /// Plan and repair with this model (the rules stay the fallback).
    pub llm: Option<belay_model::ModelSetup>,
}

impl BuildOptions {
    pub fn new(repo: impl Into<PathBuf>) -> Self {
        Self {
            repo: repo.into(),
            state_dir: None,
            run_id: None,
            image_prefix: "belay".into(),
            base: BaseSpec::Default,
            command_timeout: Duration::from_secs(900),
            docker_build_timeout: Duration::from_secs(1800),
            keep_container: false,
            oracle_file: None,
            oracle_timeout: Duration::from_secs(1800),
            oracle_collect_only: false,
            resume_from: None,
            start_at_block: None,
            network: Network::Bridge,
            host_trust: true,
            redactor: Redactor::default(),
            ablation: Ablation::Full,
            max_repair_attempts: 2,
            max_probe_failures: 5,
            cache: true,
            force_clean_replay: false,
            llm: None,
        }
    }
}

/// The result of a build that ran (successfully or not).
#[derive(Debug)]
pub struct BuildOutcome {
    pub manifest: Manifest,
    pub run_dir: PathBuf,
}

/// Resolve the state dir: `--state-dir`, else `<repo>/.belay`.
pub fn state_dir_for(repo: &Path, state_dir: Option<&Path>) -> PathBuf {
    match state_dir {
        Some(s) => s.to_path_buf(),
        None => repo.join(".belay"),
    }
}

/// Parse `<run-id>-<NNN>-<block-id>-<success|repaired|clean-replay>` from a
/// checkpoint tag: returns (run id, NNN, block id).
pub fn parse_checkpoint_tag(tag: &str) -> Option<(String, u32, String)> {
    let rest = ["-success", "-repaired", "-clean-replay"]
        .iter()
        .find_map(|s| tag.strip_suffix(s))?;
    // Run ids may contain "-NNN-" too; planned block ids never do, so the
    // rightmost "-NNN-" is the sequence number.
    let bytes = rest.as_bytes();
    for i in (0..rest.len()).rev() {
        if bytes[i] == b'-'
            && i + 5 <= rest.len()
            && bytes[i + 1..i + 4].iter().all(|b| b.is_ascii_digit())
            && bytes.get(i + 4) == Some(&b'-')
        {
            let n = rest[i + 1..i + 4].parse().ok()?;
            return Some((rest[..i].to_string(), n, rest[i + 5..].to_string()));
        }
    }
    None
}

/// Run (or resume) a build.
///
/// Returns `Ok` with the manifest whether the build succeeded or a block failed;
/// returns `Err` for bad input and for infrastructure failures (the manifest is
/// still written with the error in that case, when the run directory exists).
pub async fn build(
    rt: &dyn ContainerRuntime,
    opts: &BuildOptions,
    obs: &dyn BuildObserver,
) -> Result<BuildOutcome, EnvError> {
    let started = Instant::now();
    let ctx = analyze(&opts.repo)?;
    let repo = ctx.repo_path.clone();
    let state_dir = state_dir_for(&repo, opts.state_dir.as_deref());
    let run_id = match &opts.run_id {
        Some(id) => {
            run_id::validate(id)?;
            id.clone()
        }
        None => run_id::generate(&ctx.repo_name),
    };
    let dir = RunDir::new(&state_dir, &run_id);
    dir.create()?;
    let trust = if opts.host_trust {
        HostTrust::detect()
    } else {
        HostTrust::none()
    };
    let mut redactor = opts.redactor.clone();
    trust.register_secrets(&mut redactor);
    // The run's directory, lock, event log and registry record, opened the
    // one way every mode opens its runs.
    let handle = RunHandle::open(OpenRun {
        dir: dir.root.clone(),
        id: &run_id,
        mode: belay_record::Mode::Env,
        title: None,
        redactor: redactor.clone(),
        registry: belay_record::Registry::default_location(),
    })
    .map_err(|e| match e {
        belay_record::RecordError::Locked { .. } => EnvError::Usage(format!(
            "run {run_id} is already in progress in another belay process (lock {}); wait for it or pick another --run-id",
            dir.lock().display()
        )),
        other => other.into(),
    })?;
    let recorder = crate::progress::Recorder::new(obs, &handle);
    let obs: &dyn BuildObserver = &recorder;

    let report = reap_orphans(rt).await?;
    if !report.removed.is_empty() {
        obs.event(&BuildEvent::Phase {
            name: "reaper".into(),
            detail: format!(
                "removed {} container(s) left by belay processes that are gone",
                report.removed.len()
            ),
        });
    }

    let previous = read_manifest(&dir)?;
    let prev_blocks = read_blocks(&dir)?;
    let llm = match &opts.llm {
        Some(setup) => Some(
            setup
                .client(Some(dir.llm_usage()))
                .map_err(|e| EnvError::Usage(e.to_string()))?,
        ),
        None => None,
    };
    let mut run = Run {
        rt,
        dir: dir.clone(),
        opts,
        obs,
        redactor,
        exec_log: JsonlAppender::open(&dir.executions())?,
        container: None,
        retired: Vec::new(),
        removals: Vec::new(),
        manifest: new_manifest(&dir, &repo, previous.as_ref(), opts),
        started,
        repo,
        excluded: Vec::new(),
        env_fingerprint: String::new(),
        trust,
        ctx: ctx.clone(),
        attempts: HashMap::new(),
        image_ids: HashMap::new(),
        diverged: false,
        current_checkpoint: None,
        llm,
    };
    // Attempt numbers continue across starts, so that no earlier log is overwritten.
    if let Some(prev) = &previous {
        for e in &prev.executions {
            let n = run
                .attempts
                .entry((e.block_id.clone(), e.phase.clone()))
                .or_insert(0);
            *n = (*n).max(e.attempt);
        }
    }
    let result = run.drive(ctx, prev_blocks).await;
    let finish = run.finish(result).await;
    for c in run.retired.drain(..) {
        run.removals.push(rt.remove_detached(&c));
    }
    if opts.keep_container {
        // Keep a container with the final state (or the failed block's state).
        if run.container.is_none() {
            if let Some(img) = run.manifest.final_image.clone() {
                let _ = run.start_container(&img).await;
            }
        }
        if let Some(c) = &run.container {
            obs.event(&BuildEvent::Phase {
                name: "container".into(),
                detail: format!(
                    "kept {} (remove it with `docker rm -f`)",
                    &c[..c.len().min(12)]
                ),
            });
        }
        for c in run.retired.drain(..) {
            run.removals.push(rt.remove_detached(&c));
        }
    } else if let Some(c) = run.container.take() {
        run.removals.push(rt.remove_detached(&c));
    }
    for h in run.removals.drain(..) {
        let _ = h.await;
    }
    finish?;
    Ok(BuildOutcome {
        manifest: run.manifest,
        run_dir: dir.root,
    })
}

/// The previous manifest of a run, with its executions: an interim one (a
/// killed build) has them in `executions.jsonl` (whole lines only: a line
/// torn by the kill is skipped).
fn read_manifest(dir: &RunDir) -> Result<Option<Manifest>, EnvError> {
    let p = dir.manifest();
    let mut m: Manifest = match fs_err::read_to_string(&p) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| EnvError::BadState {
            path: p.clone(),
            message: format!(
                "line {}: {e}; move the run directory away or pick another --run-id",
                e.line()
            ),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(EnvError::io("cannot read", p, e)),
    };
    if !m.complete {
        let log = dir.executions();
        m.executions = match fs_err::read_to_string(&log) {
            Ok(t) => t
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(EnvError::io("cannot read", log, e)),
        };
    }
    Ok(Some(m))
}

fn read_blocks(dir: &RunDir) -> Result<Option<Vec<Block>>, EnvError> {
    let d = dir.blocks_dir();
    let mut blocks = Vec::new();
    let rd = match fs_err::read_dir(&d) {
        Ok(rd) => rd,
        Err(_) => return Ok(None),
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            let t = fs_err::read_to_string(&p).map_err(|e| EnvError::io("cannot read", &p, e))?;
            let b: Block = serde_json::from_str(&t).map_err(|e| EnvError::BadState {
                path: p.clone(),
                message: format!("not a block file: {e}"),
            })?;
            blocks.push(b);
        }
    }
    if blocks.is_empty() {
        return Ok(None);
    }
    blocks.sort_by_key(|b| b.order);
    Ok(Some(blocks))
}

fn new_manifest(
    dir: &RunDir,
    repo: &Path,
    previous: Option<&Manifest>,
    opts: &BuildOptions,
) -> Manifest {
    Manifest {
        ok: false,
        status: "running".into(),
        run_id: dir.run_id.clone(),
        repo_path: repo.to_path_buf(),
        state_dir: dir.state_dir.clone(),
        run_dir: dir.root.clone(),
        scripts_dir: dir.scripts_dir(),
        manifest_path: dir.manifest(),
        llm_usage_path: dir.llm_usage(),
        dockerfile_path: None,
        base_image: previous.and_then(|p| p.base_image.clone()),
        final_image: None,
        error: None,
        llm_usage: previous
            .map(|p| p.llm_usage.clone())
            .filter(|u| !u.planner.is_empty())
            .unwrap_or_else(|| LlmUsage {
                planner: "rules".into(),
                ..Default::default()
            }),
        ablation_mode: opts.ablation.as_str().into(),
        progress_control: opts.ablation.progress_control(),
        final_clean_replay_enabled: opts.ablation.final_clean_replay(),
        final_clean_replay_ok: None,
        final_clean_replay_image: None,
        final_clean_replay_failure_stage: None,
        final_clean_replay_note: None,
        oracle: None,
        cache: CacheStats {
            enabled: opts.cache,
            ..Default::default()
        },
        repairs: previous.map(|p| p.repairs).unwrap_or(0),
        blocks: vec![],
        checkpoints: previous.map(|p| p.checkpoints.clone()).unwrap_or_default(),
        executions: previous.map(|p| p.executions.clone()).unwrap_or_default(),
        complete: false,
        started_at: previous
            .map(|p| p.started_at.clone())
            .unwrap_or_else(belay_record::now_rfc3339),
        finished_at: None,
        duration_s: 0.0,
        starts: previous.map(|p| p.starts).unwrap_or(0) + 1,
        belay_version: env!("CARGO_PKG_VERSION").to_string(),
        engine_api_version: None,
        host_trust: false,
    }
}

/// A failed block step: what failed, and where its full output is.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub summary: String,
    pub log: PathBuf,
    pub stdout_tail: String,
    pub stderr_tail: String,
}

pub(crate) struct Run<'a> {
    pub(crate) rt: &'a dyn ContainerRuntime,
    pub(crate) dir: RunDir,
    pub(crate) opts: &'a BuildOptions,
    pub(crate) obs: &'a dyn BuildObserver,
    pub(crate) redactor: Redactor,
    pub(crate) trust: HostTrust,
    pub(crate) exec_log: JsonlAppender,
    pub(crate) container: Option<String>,
    /// Retired containers, removed in the background once the next container
    /// has started (so that removal never competes with the start).
    pub(crate) retired: Vec<String>,
    /// Removals of retired containers, running in the background.
    pub(crate) removals: Vec<tokio::task::JoinHandle<()>>,
    pub(crate) manifest: Manifest,
    pub(crate) started: Instant,
    pub(crate) repo: PathBuf,
    /// Paths (relative to the repo) not copied into the container.
    pub(crate) excluded: Vec<String>,
    /// What containers see besides their image (for cache keys).
    pub(crate) env_fingerprint: String,
    pub(crate) ctx: RepoContext,
    /// Next attempt number per (block, phase).
    pub(crate) attempts: HashMap<(String, String), u32>,
    /// Image ids of checkpoint refs seen in this run.
    pub(crate) image_ids: HashMap<String, String>,
    /// The forward state may differ from a clean run of the final scripts
    /// (a repair ran in a live, unrolled-back container).
    pub(crate) diverged: bool,
    /// The checkpoint the current container started from (for records).
    pub(crate) current_checkpoint: Option<String>,
    /// The model client, when planning and repair use a model.
    pub(crate) llm: Option<belay_model::ModelClient>,
}

impl Run<'_> {
    /// The plan: the model's when a model is configured and answers well,
    /// else the rules' (the reason is logged and kept in the manifest).
    pub(crate) async fn plan_blocks(
        &mut self,
        ctx: &RepoContext,
        notes: &RuntimeNotes,
    ) -> Result<Vec<Block>, EnvError> {
        let rules = plan_rules(ctx, notes);
        let Some(client) = self.llm.clone() else {
            return rules;
        };
        self.manifest.llm_usage.planner = "llm".into();
        self.manifest.llm_usage.model = Some(client.config().model.clone());
        let mut said = Vec::new();
        let t0 = Instant::now();
        let baseline = rules.as_deref().unwrap_or(&[]);
        let answer = crate::llm::plan(&client, ctx, notes, baseline, &mut |m| said.push(m)).await;
        for m in said {
            self.phase("plan", m);
        }
        match answer {
            Ok(blocks) => {
                let what = format!(
                    "model plan ({}): {}",
                    client.config().model,
                    blocks
                        .iter()
                        .map(|b| b.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                self.phase("plan", what.clone());
                self.record_phase("plan", "llm_plan", &what, true, t0.elapsed())?;
                Ok(blocks)
            }
            Err(why) => {
                let what =
                    format!("the model planner failed ({why}); falling back to the rules planner");
                self.manifest.llm_usage.planner = "rules (llm fallback)".into();
                self.manifest
                    .llm_usage
                    .fallbacks
                    .push(format!("plan: {why}"));
                self.phase("plan", what.clone());
                self.record_phase("plan", "llm_plan", &what, false, t0.elapsed())?;
                rules
            }
        }
    }

    /// A bookkeeping record of a phase that ran no container command.
    pub(crate) fn record_phase(
        &mut self,
        block: &str,
        phase: &str,
        what: &str,
        ok: bool,
        took: Duration,
    ) -> Result<(), EnvError> {
        let attempt = self.next_attempt(block, phase);
        self.record(crate::manifest::Execution {
            block_id: block.to_string(),
            phase: phase.to_string(),
            attempt,
            exit_code: Some(if ok { 0 } else { 1 }),
            timed_out: false,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            checkpoint_before: self.current_checkpoint.clone(),
            checkpoint_after: None,
            repair_command: None,
            duration_s: round3(took.as_secs_f64()),
            command: what.to_string(),
            log_path: None,
            started_at: belay_record::now_rfc3339(),
        })
    }

    /// `llm-usage.json`: the model ledger's full report (when a model was
    /// used) with the planner and fallbacks; the manifest gets the totals.
    fn write_llm_usage(&mut self) -> Result<(), EnvError> {
        let Some(client) = &self.llm else {
            return write_redacted_json(
                &self.dir.llm_usage(),
                &self.manifest.llm_usage,
                &self.redactor,
            );
        };
        let r = client.ledger().report();
        let u = &mut self.manifest.llm_usage;
        u.model = Some(r.model.clone());
        u.requests = r.requests;
        u.retries = r.retries;
        u.input_tokens = r.input_tokens;
        u.cached_input_tokens = r.cached_tokens;
        u.output_tokens = r.output_tokens;
        u.reasoning_tokens = r.reasoning_tokens;
        u.latency_s = round3(r.latency_s_total);
        u.cost_usd = r.cost_usd;
        let mut v = serde_json::to_value(&r).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("planner".into(), serde_json::json!(u.planner));
            o.insert("fallbacks".into(), serde_json::json!(u.fallbacks));
        }
        write_redacted_json(&self.dir.llm_usage(), &v, &self.redactor)
    }

    /// The interim manifest: everything but the executions (appended to
    /// `executions.jsonl` as they happen) and the blocks (each in
    /// `blocks/<id>.json`), so that rewriting it after every block does not
    /// grow with the build.
    pub(crate) fn save(&mut self) -> Result<(), EnvError> {
        self.manifest.duration_s = round3(self.started.elapsed().as_secs_f64());
        let executions = std::mem::take(&mut self.manifest.executions);
        let blocks = std::mem::take(&mut self.manifest.blocks);
        self.manifest.complete = false;
        let r = write_redacted_json(&self.dir.manifest(), &self.manifest, &self.redactor);
        self.manifest.executions = executions;
        self.manifest.blocks = blocks;
        r
    }

    /// The final manifest, with every execution, written once.
    fn save_final(&mut self) -> Result<(), EnvError> {
        self.manifest.duration_s = round3(self.started.elapsed().as_secs_f64());
        self.manifest.complete = true;
        write_redacted_json(&self.dir.manifest(), &self.manifest, &self.redactor)
    }

    /// Write a block's state (`blocks/<id>.json`).
    pub(crate) fn save_block(&self, b: &Block) -> Result<(), EnvError> {
        write_redacted_json(
            &self.dir.blocks_dir().join(format!("{}.json", b.id)),
            b,
            &self.redactor,
        )
    }

    /// Write a block's state and its script (`scripts/<id>.sh`).
    pub(crate) fn save_block_and_script(&self, b: &Block) -> Result<(), EnvError> {
        self.save_block(b)?;
        belay_record::atomic_write(
            &self.dir.scripts_dir().join(format!("{}.sh", b.id)),
            self.redactor.redact(&b.script).as_bytes(),
        )?;
        Ok(())
    }

    pub(crate) fn record(&mut self, exec: Execution) -> Result<(), EnvError> {
        self.exec_log.append(&exec, &self.redactor)?;
        self.manifest.executions.push(exec);
        Ok(())
    }

    pub(crate) fn phase(&self, name: &str, detail: impl Into<String>) {
        self.obs.event(&BuildEvent::Phase {
            name: name.into(),
            detail: detail.into(),
        });
    }

    /// The next attempt number of `phase` for `block` (1, 2, ...), so that
    /// every run of a phase gets its own `logs/<block>/<phase>-attempt-N.log`.
    pub(crate) fn next_attempt(&mut self, block: &str, phase: &str) -> u32 {
        let n = self
            .attempts
            .entry((block.to_string(), phase.to_string()))
            .or_insert(0);
        *n += 1;
        *n
    }

    /// Run `argv` in the current container, log it, and record an execution.
    pub(crate) async fn exec(
        &mut self,
        block: &str,
        phase: &str,
        argv: Vec<String>,
        display: &str,
        timeout: Duration,
        repair_command: Option<String>,
    ) -> Result<(ExecOutcome, PathBuf), EnvError> {
        let container = self
            .container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))?;
        let attempt = self.next_attempt(block, phase);
        let log_path = self.dir.log_path(block, phase, attempt);
        let started_at = belay_record::now_rfc3339();
        let spec = ExecSpec {
            argv,
            working_dir: Some(REPO_DIR.to_string()),
            env: self.trust.proxy_env.clone(),
            timeout: Some(timeout),
            log_path: log_path.clone(),
            log_limit: None,
        };
        let observer = BlockOutput {
            block,
            observer: self.obs,
        };
        let out = self
            .rt
            .exec(&container, &spec, &self.redactor, &observer)
            .await?;
        let checkpoint_before = self.current_checkpoint.clone();
        self.record(Execution {
            block_id: block.to_string(),
            phase: phase.to_string(),
            attempt,
            exit_code: Some(out.exit_code),
            timed_out: out.timed_out,
            stdout_tail: out.stdout_tail.clone(),
            stderr_tail: out.stderr_tail.clone(),
            checkpoint_before,
            checkpoint_after: None,
            repair_command,
            duration_s: round3(out.duration.as_secs_f64()),
            command: display.to_string(),
            log_path: Some(log_path.clone()),
            started_at,
        })?;
        Ok((out, log_path))
    }

    /// Put a block's script into the container and run it (and nothing else).
    pub(crate) async fn run_script(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<Result<f64, Failure>, EnvError> {
        let container = self.container.clone().unwrap_or_default();
        let path = block.container_script_path();
        self.rt
            .put_files(
                &container,
                &[(
                    path.clone(),
                    self.redactor
                        .redact(&block.script)
                        .into_owned()
                        .into_bytes(),
                    0o755,
                )],
            )
            .await?;
        let (out, log) = self
            .exec(
                &block.id,
                phase,
                vec!["bash".into(), path.clone()],
                &format!("bash {path}"),
                self.opts.command_timeout,
                None,
            )
            .await?;
        Ok(if out.success() {
            Ok(out.duration.as_secs_f64())
        } else {
            Err(failure(
                "the block script",
                &out,
                log,
                self.opts.command_timeout,
            ))
        })
    }

    /// Run a block's commands one at a time, each with the script's prelude.
    pub(crate) async fn run_commands(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<Result<f64, Failure>, EnvError> {
        let (prelude, commands) = script::split_commands(&block.script);
        let mut total = 0.0;
        for cmd in commands {
            let (out, log) = self
                .exec(
                    &block.id,
                    phase,
                    vec!["bash".into(), "-c".into(), format!("{prelude}{cmd}")],
                    &cmd,
                    self.opts.command_timeout,
                    None,
                )
                .await?;
            total += out.duration.as_secs_f64();
            if !out.success() {
                return Ok(Err(failure(
                    &format!("command `{}`", first_line(&cmd)),
                    &out,
                    log,
                    self.opts.command_timeout,
                )));
            }
        }
        Ok(Ok(total))
    }

    pub(crate) async fn run_validation(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<Result<f64, Failure>, EnvError> {
        let (out, log) = self
            .exec(
                &block.id,
                phase,
                vec!["bash".into(), "-c".into(), block.validation_command.clone()],
                &block.validation_command,
                self.opts.command_timeout,
                None,
            )
            .await?;
        Ok(if out.success() {
            Ok(out.duration.as_secs_f64())
        } else {
            Err(failure(
                &format!("validation `{}`", block.validation_command),
                &out,
                log,
                self.opts.command_timeout,
            ))
        })
    }

    /// Forward execution of one block at the ablation's granularity, then its
    /// validation.
    async fn forward_block(
        &mut self,
        block: &Block,
    ) -> Result<(Result<(), Failure>, BlockTiming), EnvError> {
        let mut timing = BlockTiming::default();
        let run = match self.opts.ablation.forward() {
            Granularity::Command => self.run_commands(block, "command_forward").await?,
            _ => self.run_script(block, "block").await?,
        };
        match run {
            Ok(s) => timing.script_s = round3(s),
            Err(f) => return Ok((Err(f), timing)),
        }
        match self.run_validation(block, "validation").await? {
            Ok(s) => timing.validation_s = round3(s),
            Err(f) => return Ok((Err(f), timing)),
        }
        Ok((Ok(()), timing))
    }

    async fn resolve_base(&mut self) -> Result<String, EnvError> {
        match &self.opts.base {
            BaseSpec::Image(img) => {
                if !self.rt.image_exists(img).await? {
                    return Err(SandboxError::ImageMissing {
                        image: img.clone(),
                        hint: "No image registry is used: build or load it first (`docker images` lists what is there), or use --base-dockerfile".into(),
                    }
                    .into());
                }
                Ok(img.clone())
            }
            BaseSpec::Default => {
                if !self.rt.image_exists(DEFAULT_BASE_IMAGE).await? {
                    return Err(SandboxError::ImageMissing {
                        image: DEFAULT_BASE_IMAGE.into(),
                        hint: "It is belay's default base image, built offline from your apt mirror: run `belay image bootstrap` (about a minute), or pass --base-image / --base-dockerfile".into(),
                    }
                    .into());
                }
                Ok(DEFAULT_BASE_IMAGE.to_string())
            }
            BaseSpec::Dockerfile(df) => {
                let df = df.canonicalize().map_err(|e| {
                    EnvError::Usage(format!(
                        "--base-dockerfile {}: {e}. Pass the path of an existing Dockerfile",
                        df.display()
                    ))
                })?;
                let context = df
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."));
                let tag = format!("{}:{}-base", self.opts.image_prefix, self.dir.run_id);
                let attempt = self.next_attempt("docker_build", "docker_build");
                let log_path = self.dir.log_path("docker_build", "docker_build", attempt);
                self.phase("base image", format!("building {} as {tag}", df.display()));
                let t0 = Instant::now();
                let mut lbl = BTreeMap::new();
                lbl.insert(labels::BELAY.to_string(), "true".to_string());
                lbl.insert(labels::RUN.to_string(), self.dir.run_id.clone());
                lbl.insert(labels::KIND.to_string(), "base".to_string());
                let res = self
                    .rt
                    .build(
                        &BuildRequest {
                            dockerfile: df.clone(),
                            context_dir: context.clone(),
                            tag: tag.clone(),
                            labels: lbl,
                            timeout: self.opts.docker_build_timeout,
                            log_path: log_path.clone(),
                            network: Network::Bridge,
                        },
                        &self.redactor,
                    )
                    .await;
                let (code, err) = match &res {
                    Ok(_) => (Some(0), String::new()),
                    Err(e) => (None, e.to_string()),
                };
                self.record(Execution {
                    block_id: "docker_build".into(),
                    phase: "docker_build".into(),
                    attempt,
                    exit_code: code,
                    timed_out: matches!(res, Err(SandboxError::BuildTimeout { .. })),
                    stdout_tail: String::new(),
                    stderr_tail: err,
                    checkpoint_before: None,
                    checkpoint_after: res.as_ref().ok().map(|_| tag.clone()),
                    repair_command: None,
                    duration_s: round3(t0.elapsed().as_secs_f64()),
                    command: format!("docker build -f {} {}", df.display(), context.display()),
                    log_path: Some(log_path),
                    started_at: belay_record::now_rfc3339(),
                })?;
                res?;
                Ok(tag)
            }
        }
    }

    /// The environment containers are created with (and checkpoints keep):
    /// CA variables and HOME, never proxy credentials (see [`HostTrust::container_env`]).
    pub(crate) fn container_env(&self) -> Vec<(String, String)> {
        let mut env = self.trust.ca_env();
        env.push(("HOME".into(), "/root".into()));
        env
    }

    pub(crate) async fn start_container(&mut self, image: &str) -> Result<(), EnvError> {
        if let Some(old) = self.container.take() {
            self.retired.push(old);
        }
        let spec = ContainerSpec {
            image: image.to_string(),
            run_id: self.dir.run_id.clone(),
            kind: "env-build".into(),
            network: self.opts.network,
            env: self.container_env(),
            working_dir: Some(REPO_DIR.to_string()),
            // Kept containers are the user's: the reaper must leave them alone.
            unowned: self.opts.keep_container,
            ..Default::default()
        };
        let id = self.rt.create(&spec).await?;
        for old in self.retired.drain(..) {
            self.removals.push(self.rt.remove_detached(&old));
        }
        let mut log = JsonlAppender::open(&self.dir.containers())?;
        log.append(
            &serde_json::json!({"container": id, "image": image, "created_at": belay_record::now_rfc3339(), "pid": std::process::id()}),
            &self.redactor,
        )?;
        self.container = Some(id);
        Ok(())
    }

    /// A fresh container holding the repository copy and the trust files.
    pub(crate) async fn start_workspace_container(&mut self, image: &str) -> Result<(), EnvError> {
        self.start_container(image).await?;
        let container = self.container.clone().unwrap_or_default();
        let files = self.trust.container_files();
        if !files.is_empty() {
            self.rt.put_files(&container, &files).await?;
        }
        let filter = TarFilter {
            exclude: self.excluded.iter().map(PathBuf::from).collect(),
            ignore: None,
        };
        self.rt
            .copy_dir_in(&container, &self.repo, REPO_DIR, &filter)
            .await?;
        Ok(())
    }

    /// The retired container's work is checkpointed: it goes away in the background.
    pub(crate) fn retire_container(&mut self) {
        if let Some(c) = self.container.take() {
            self.retired.push(c);
        }
    }

    /// Make sure a container holding `image` is running.
    async fn ensure_container(&mut self, image: &str) -> Result<(), EnvError> {
        if self.container.is_none() {
            self.start_container(image).await?;
        }
        Ok(())
    }

    pub(crate) async fn image_id(&mut self, image_ref: &str) -> Result<String, EnvError> {
        if let Some(id) = self.image_ids.get(image_ref) {
            return Ok(id.clone());
        }
        let id = self
            .rt
            .image(image_ref)
            .await?
            .map(|i| i.id)
            .ok_or_else(|| {
                EnvError::from(SandboxError::ImageMissing {
                    image: image_ref.to_string(),
                    hint: "a checkpoint of this run disappeared from the engine (removed by hand?); rerun to rebuild from the last checkpoint that exists".into(),
                })
            })?;
        self.image_ids.insert(image_ref.to_string(), id.clone());
        Ok(id)
    }

    /// Commit the current container as a checkpoint.
    pub(crate) async fn commit(
        &mut self,
        block: &str,
        seq: u32,
        kind: &str,
        parent: Option<String>,
        extra_labels: BTreeMap<String, String>,
    ) -> Result<Checkpoint, EnvError> {
        let container = self
            .container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))?;
        let image_ref = checkpoint_ref(&self.opts.image_prefix, &self.dir.run_id, seq, block, kind);
        // `docker commit` keeps the parent image's labels unless they are set:
        // every cache label is set (empty when it does not apply), so that a
        // checkpoint never answers to its parent's keys.
        let mut lbl: BTreeMap<String, String> =
            [cache::KEY_LABEL, cache::ALT_LABEL, cache::SCRIPT_LABEL]
                .iter()
                .map(|k| (k.to_string(), String::new()))
                .collect();
        lbl.extend(extra_labels);
        lbl.insert(labels::RUN.to_string(), self.dir.run_id.clone());
        lbl.insert(labels::KIND.to_string(), "checkpoint".to_string());
        lbl.insert(labels::BLOCK.to_string(), block.to_string());
        lbl.insert(CHECKPOINT_KIND_LABEL.to_string(), kind.to_string());
        if let Some(base) = &self.manifest.base_image {
            lbl.insert(BASE_LABEL.to_string(), base.clone());
        }
        let image_id = self.rt.commit(&container, &image_ref, &lbl).await?;
        self.image_ids.insert(image_ref.clone(), image_id.clone());
        let cp = Checkpoint {
            id: format!("{seq:03}-{block}"),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: parent,
            kind: kind.to_string(),
            image_id,
            created_at: belay_record::now_rfc3339(),
            cached_from: None,
        };
        self.push_checkpoint(cp.clone());
        Ok(cp)
    }

    fn push_checkpoint(&mut self, cp: Checkpoint) {
        self.manifest
            .checkpoints
            .retain(|c| c.id != cp.id || c.kind != cp.kind);
        self.manifest.checkpoints.push(cp);
    }

    /// Decide whether the next block continues in this container.
    ///
    /// `docker commit` archives the container's whole writable layer, i.e.
    /// everything since the container started. While that layer is small (the
    /// last commit was cheaper than starting a container), the next block
    /// continues here; once it is large, the next block starts in a fresh
    /// container from the checkpoint just made (as `docker build` runs each
    /// step), so commits stay proportional to one block's own changes.
    pub(crate) fn after_checkpoint(&mut self, commit_took: Duration) {
        tracing::debug!(
            commit_ms = commit_took.as_millis() as u64,
            keep = commit_took <= KEEP_CONTAINER_BELOW,
            "checkpoint committed"
        );
        if commit_took > KEEP_CONTAINER_BELOW {
            self.retire_container();
        }
    }

    /// Cache key of `block` on top of `parent`.
    async fn block_key(&mut self, block: &Block, parent: &str) -> Result<String, EnvError> {
        let parent_id = self.image_id(parent).await?;
        Ok(cache::block_key(
            &parent_id,
            &block.id,
            &block.script,
            &block.validation_command,
            &self.env_fingerprint,
        ))
    }

    /// The newest checkpoint image made under `key` (or, for repaired ones,
    /// whose unpatched script had `key`).
    async fn cache_lookup(
        &mut self,
        key: &str,
        block: &str,
    ) -> Result<Option<belay_sandbox::ImageInfo>, EnvError> {
        let of_block = |i: &belay_sandbox::ImageInfo| {
            i.labels.get(labels::BLOCK).map(String::as_str) == Some(block)
        };
        let mut found: Vec<_> = self
            .rt
            .list_images(&[format!("{}={key}", cache::KEY_LABEL)])
            .await?
            .into_iter()
            .filter(of_block)
            .collect();
        if found.is_empty() {
            found = self
                .rt
                .list_images(&[format!("{}={key}", cache::ALT_LABEL)])
                .await?
                .into_iter()
                .filter(of_block)
                .collect();
        }
        found.sort_by_key(|i| std::cmp::Reverse(i.created));
        Ok(found.into_iter().next())
    }

    /// Adopt a cached checkpoint as this run's checkpoint `seq` for `block`.
    async fn adopt_cached(
        &mut self,
        hit: belay_sandbox::ImageInfo,
        block: &str,
        seq: u32,
        parent: Option<String>,
    ) -> Result<Checkpoint, EnvError> {
        let kind = hit
            .labels
            .get(CHECKPOINT_KIND_LABEL)
            .cloned()
            .unwrap_or_else(|| "success".into());
        let image_ref =
            checkpoint_ref(&self.opts.image_prefix, &self.dir.run_id, seq, block, &kind);
        self.rt.tag_image(&hit.id, &image_ref).await?;
        self.image_ids.insert(image_ref.clone(), hit.id.clone());
        let cp = Checkpoint {
            id: format!("{seq:03}-{block}"),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: parent,
            kind,
            image_id: hit.id.clone(),
            created_at: belay_record::now_rfc3339(),
            cached_from: Some(
                hit.tags
                    .iter()
                    .find(|t| !t.contains("<none>"))
                    .cloned()
                    .unwrap_or(hit.id.clone()),
            ),
        };
        self.push_checkpoint(cp.clone());
        self.manifest.cache.hits += 1;
        Ok(cp)
    }

    /// Where to start: the image to start from and the block it completed.
    async fn resume_point(
        &self,
        blocks: Option<&Vec<Block>>,
    ) -> Result<Option<(String, Option<String>)>, EnvError> {
        if let Some(img) = &self.opts.resume_from {
            if !self.rt.image_exists(img).await? {
                return Err(SandboxError::ImageMissing {
                    image: img.clone(),
                    hint: "--resume-from needs a checkpoint image that exists (`docker images` lists them)".into(),
                }
                .into());
            }
            let inferred = parse_checkpoint_tag(belay_sandbox::split_image_ref(img).1).map(|t| t.2);
            return Ok(Some((img.clone(), inferred)));
        }
        if blocks.is_none() {
            return Ok(None);
        }
        // Same run id: the newest recorded block checkpoint that still exists.
        let mut cps: Vec<&Checkpoint> = self
            .manifest
            .checkpoints
            .iter()
            .filter(|c| c.kind == "success" || c.kind == "repaired")
            .collect();
        cps.sort_by_key(|c| c.id.clone());
        for cp in cps.iter().rev() {
            if self.rt.image_exists(&cp.image_ref).await? {
                return Ok(Some((cp.image_ref.clone(), Some(cp.block_id.clone()))));
            }
        }
        Ok(None)
    }

    /// The runtime notes of the base image: from this run, from the preflight
    /// cache of the base image, or from a fresh preflight in the current container.
    /// The runtime notes of the base image: from this run, from the preflight
    /// cache (keyed by the base image's id, so shared by every run on this
    /// machine), or from a fresh preflight in a container of `image`.
    async fn runtime_notes(
        &mut self,
        base_id: &str,
        image: &str,
    ) -> Result<RuntimeNotes, EnvError> {
        if let Some(n) = read_context(&self.dir).and_then(|c| c.runtime_notes) {
            return Ok(n);
        }
        let cache_file = preflight_cache_dir(&self.dir.state_dir)
            .join(format!("preflight-{}.json", base_id.replace(':', "-")));
        if self.opts.cache {
            if let Ok(t) = fs_err::read_to_string(&cache_file) {
                if let Ok(n) = serde_json::from_str::<RuntimeNotes>(&t) {
                    return Ok(n);
                }
            }
        }
        self.ensure_container(image).await?;
        let n = self.preflight().await?;
        if let Some(d) = cache_file.parent() {
            if fs_err::create_dir_all(d).is_ok() {
                let _ = write_json_atomic(&cache_file, &n);
            }
        }
        Ok(n)
    }

    async fn preflight(&mut self) -> Result<RuntimeNotes, EnvError> {
        self.phase("preflight", "reading facts from the image");
        let (out, log) = self
            .exec(
                "container_preflight",
                "container_preflight",
                vec!["/bin/sh".into(), "-c".into(), preflight::script()],
                "container preflight",
                Duration::from_secs(120),
                None,
            )
            .await?;
        if !out.success() {
            return Err(EnvError::Plan(format!(
                "the container preflight failed (exit {}); does the image have /bin/sh? Log: {}",
                out.exit_code,
                log.display()
            )));
        }
        let text = fs_err::read_to_string(&log).unwrap_or_default();
        Ok(RuntimeNotes::parse(&text))
    }

    async fn drive(
        &mut self,
        mut ctx: RepoContext,
        prev_blocks: Option<Vec<Block>>,
    ) -> Result<(), EnvError> {
        self.manifest.host_trust = self.trust.enabled();
        if let Some(ca) = &self.trust.ca_bundle {
            belay_record::atomic_write(&self.dir.ca_bundle(), ca)?;
        }
        let state_rel = self
            .dir
            .state_dir
            .strip_prefix(&self.repo)
            .ok()
            .map(Path::to_path_buf);
        self.excluded = excluded_paths(&ctx, state_rel.as_deref());
        self.env_fingerprint = cache::env_fingerprint(
            &self.container_env(),
            &self.trust.container_files(),
            self.opts.network.as_docker(),
        );

        let resume = self.resume_point(prev_blocks.as_ref()).await?;
        self.obs.event(&BuildEvent::RunStarted {
            run_id: self.dir.run_id.clone(),
            run_dir: self.dir.root.display().to_string(),
            resumed_from: resume.as_ref().map(|r| r.0.clone()),
        });

        let (mut blocks, start_index, current) = match resume {
            Some((image, done_block)) => {
                if self.manifest.base_image.is_none() {
                    // A checkpoint records the base image it grew from.
                    let recorded = self
                        .rt
                        .image(&image)
                        .await?
                        .and_then(|i| i.labels.get(BASE_LABEL).cloned())
                        .filter(|b| !b.is_empty());
                    self.manifest.base_image = Some(recorded.unwrap_or_else(|| image.clone()));
                }
                let notes = match read_context(&self.dir).and_then(|c| c.runtime_notes) {
                    Some(n) => n,
                    None => {
                        // Plan for the base image the checkpoint grew from, not for
                        // the checkpoint: the final scripts must rebuild from the base.
                        let base = self
                            .manifest
                            .base_image
                            .clone()
                            .unwrap_or_else(|| image.clone());
                        let n = match self.image_id(&base).await {
                            Ok(base_id) => self.runtime_notes(&base_id, &base).await?,
                            Err(_) => {
                                self.phase(
                                    "warning",
                                    format!("the base image {base} is gone: planning from the checkpoint instead"),
                                );
                                let id = self.image_id(&image).await?;
                                self.runtime_notes(&id, &image).await?
                            }
                        };
                        ctx.runtime_notes = Some(n.clone());
                        write_redacted_json(&self.dir.context(), &ctx, &self.redactor)?;
                        n
                    }
                };
                // The preflight may have used a container of the base image.
                self.retire_container();
                self.start_container(&image).await?;
                // The same run id reuses its blocks; another run's checkpoint gets
                // the plan for its base image.
                let mut blocks = match prev_blocks {
                    Some(b) => b,
                    None => self.plan_blocks(&ctx, &notes).await?,
                };
                if self.opts.resume_from.is_none() {
                    self.warn_if_repo_changed().await;
                }
                // Starting from another run's checkpoint (or at a chosen block),
                // the forward run is not a run of these scripts from the base
                // image: the final scripts must be replayed to be proven.
                if self.opts.resume_from.is_some() || self.opts.start_at_block.is_some() {
                    self.diverged = true;
                }
                let start = start_index_for(
                    &blocks,
                    self.opts.start_at_block.as_deref(),
                    done_block.as_deref(),
                    &image,
                )?;
                self.phase(
                    "resume",
                    format!(
                        "from {image}, at block {}",
                        blocks
                            .get(start)
                            .map(|b| b.id.as_str())
                            .unwrap_or("(finalize)")
                    ),
                );
                for (i, b) in blocks.iter_mut().enumerate() {
                    if i < start {
                        if !matches!(b.status, BlockStatus::Succeeded | BlockStatus::Repaired) {
                            b.status = BlockStatus::Skipped;
                        }
                    } else {
                        b.status = BlockStatus::Planned;
                        b.last_error = None;
                    }
                }
                (blocks, start, image)
            }
            None => {
                let base = self.resolve_base().await?;
                self.manifest.base_image = Some(base.clone());
                let base_id = self.image_id(&base).await?;
                // Keys are always recorded, so that later builds can reuse these
                // checkpoints; `--no-cache` only turns off the lookup.
                let (repo, excluded) = (self.repo.clone(), self.excluded.clone());
                let tree = tokio::task::spawn_blocking(move || cache::tree_hash(&repo, &excluded))
                    .await
                    .map_err(|e| {
                        EnvError::Usage(format!("hashing the repository failed: {e}"))
                    })??;
                let ws_key = Some(cache::workspace_key(&base_id, &tree, &self.env_fingerprint));
                let hit = match &ws_key {
                    Some(k) if self.opts.cache => self.cache_lookup(k, "workspace").await?,
                    _ => None,
                };
                let current = match hit {
                    Some(hit) => {
                        self.phase("cache", "workspace checkpoint reused");
                        let cp = self
                            .adopt_cached(hit, "workspace", 0, Some(base.clone()))
                            .await?;
                        cp.image_ref
                    }
                    None => {
                        self.phase("container", format!("starting from {base}"));
                        self.phase("copy", format!("{} -> {REPO_DIR}", self.repo.display()));
                        self.start_workspace_container(&base).await?;
                        let mut extra = BTreeMap::new();
                        if let Some(k) = &ws_key {
                            extra.insert(cache::KEY_LABEL.to_string(), k.clone());
                            if self.opts.cache {
                                self.manifest.cache.misses += 1;
                            }
                        }
                        // Preflight before the commit, so that a container exists.
                        let notes = self.runtime_notes(&base_id, &base).await?;
                        ctx.runtime_notes = Some(notes);
                        let cp_t0 = Instant::now();
                        let cp = self
                            .commit("workspace", 0, "success", Some(base.clone()), extra)
                            .await?;
                        self.after_checkpoint(cp_t0.elapsed());
                        cp.image_ref
                    }
                };
                if ctx.runtime_notes.is_none() {
                    ctx.runtime_notes = Some(self.runtime_notes(&base_id, &current).await?);
                }
                write_redacted_json(&self.dir.context(), &ctx, &self.redactor)?;
                let blocks = match prev_blocks {
                    Some(b) => {
                        self.phase("plan", "reusing blocks/*.json of this run id");
                        b
                    }
                    None => {
                        let notes = ctx
                            .runtime_notes
                            .clone()
                            .unwrap_or_else(RuntimeNotes::assumed_debian);
                        self.plan_blocks(&ctx, &notes).await?
                    }
                };
                (blocks, 0, current)
            }
        };
        self.ctx = ctx;
        self.obs.event(&BuildEvent::Plan {
            blocks: blocks
                .iter()
                .map(|b| (b.id.clone(), b.title.clone()))
                .collect(),
        });
        for b in &blocks {
            self.save_block_and_script(b)?;
        }
        self.manifest.blocks = blocks.clone();
        self.save()?;

        let mut current = current;
        if self.opts.ablation.forward() == Granularity::WholeScript && start_index == 0 {
            if let Some(cp) = self.whole_script_forward(&mut blocks, &current).await? {
                return self.finalize(&blocks, cp).await;
            }
            // The whole script failed: fall back to block-level forward with recovery.
            self.retire_container();
        }
        self.current_checkpoint = Some(current.clone());
        let mut i = start_index;
        let mut rollbacks: Vec<(usize, usize)> = Vec::new();
        while i < blocks.len() {
            let t0 = Instant::now();
            let seq = i as u32 + 1;
            blocks[i].baseline_checkpoint = Some(current.clone());
            let key = self.block_key(&blocks[i], &current).await?;
            if self.opts.cache {
                if let Some(hit) = self.cache_lookup(&key, &blocks[i].id.clone()).await? {
                    let adopted_script = hit
                        .labels
                        .get(cache::SCRIPT_LABEL)
                        // Checkpoints that were not repaired carry it empty.
                        .filter(|h| !h.is_empty())
                        .and_then(|h| hex::decode(h).ok())
                        .filter(|b| !b.is_empty())
                        .and_then(|b| String::from_utf8(b).ok());
                    let cp = self
                        .adopt_cached(hit, &blocks[i].id.clone(), seq, Some(current.clone()))
                        .await?;
                    // The cached checkpoint is not in the current container.
                    self.retire_container();
                    let b = &mut blocks[i];
                    if let Some(s) = adopted_script {
                        b.script = s;
                    }
                    b.status = if cp.kind == "repaired" {
                        BlockStatus::Repaired
                    } else {
                        BlockStatus::Succeeded
                    };
                    b.cached = true;
                    b.last_error = None;
                    b.timing = Some(BlockTiming {
                        total_s: round3(t0.elapsed().as_secs_f64()),
                        ..Default::default()
                    });
                    let detail = format!("from {}", cp.cached_from.unwrap_or_default());
                    current = self.block_done(&mut blocks, i, cp.image_ref, true, t0, detail)?;
                    i += 1;
                    continue;
                }
                self.manifest.cache.misses += 1;
            }
            self.ensure_container(&current).await?;
            blocks[i].status = BlockStatus::Running;
            blocks[i].cached = false;
            self.save_block(&blocks[i])?;
            self.manifest.blocks = blocks.clone();
            self.save()?;
            self.obs.event(&BuildEvent::BlockStarted {
                id: blocks[i].id.clone(),
                title: blocks[i].title.clone(),
                index: i,
                total: blocks.len(),
            });
            let (step, mut timing) = self.forward_block(&blocks[i].clone()).await?;
            match step {
                Ok(()) => {
                    let cp_t0 = Instant::now();
                    let extra = BTreeMap::from([(cache::KEY_LABEL.to_string(), key)]);
                    let cp = self
                        .commit(
                            &blocks[i].id.clone(),
                            seq,
                            "success",
                            Some(current.clone()),
                            extra,
                        )
                        .await?;
                    self.after_checkpoint(cp_t0.elapsed());
                    timing.checkpoint_s = round3(cp_t0.elapsed().as_secs_f64());
                    timing.total_s = round3(t0.elapsed().as_secs_f64());
                    self.set_last_checkpoint_after(&cp.image_ref);
                    blocks[i].status = BlockStatus::Succeeded;
                    blocks[i].last_error = None;
                    blocks[i].timing = Some(timing);
                    current =
                        self.block_done(&mut blocks, i, cp.image_ref, false, t0, String::new())?;
                    i += 1;
                }
                Err(fail) => {
                    let outcome = if self.opts.ablation.local_repair() {
                        self.recover(&mut blocks, i, &current, fail, &mut rollbacks)
                            .await?
                    } else {
                        recover::Recovery::Failed(format!(
                            "{} (local repair is off in this ablation mode)",
                            fail.summary
                        ))
                    };
                    match outcome {
                        recover::Recovery::Repaired(cp) => {
                            let mut t = blocks[i].timing.clone().unwrap_or_default();
                            t.total_s = round3(t0.elapsed().as_secs_f64());
                            blocks[i].timing = Some(t);
                            let detail =
                                format!("repaired after {} attempt(s)", blocks[i].repair_attempts);
                            current = self.block_done(&mut blocks, i, cp, false, t0, detail)?;
                            i += 1;
                        }
                        recover::Recovery::RollBack(j) => {
                            current = blocks[j].baseline_checkpoint.clone().ok_or_else(|| {
                                EnvError::Usage(format!(
                                    "block {} has no baseline checkpoint to roll back to",
                                    blocks[j].id
                                ))
                            })?;
                            self.current_checkpoint = Some(current.clone());
                            self.retire_container();
                            // Checkpoints from block j on are stale: a resume must not
                            // pick them over the patched block.
                            let first_stale = j as u32 + 1;
                            self.manifest.checkpoints.retain(|c| {
                                c.id.get(..3)
                                    .and_then(|n| n.parse::<u32>().ok())
                                    .is_none_or(|n| n < first_stale)
                            });
                            for b in blocks.iter_mut().take(i + 1).skip(j) {
                                b.status = BlockStatus::Planned;
                                b.cached = false;
                            }
                            for b in blocks.iter().take(i + 1).skip(j) {
                                self.save_block(b)?;
                            }
                            self.manifest.blocks = blocks.clone();
                            self.save()?;
                            self.phase("rollback", format!("back to {} ({current})", blocks[j].id));
                            i = j;
                        }
                        recover::Recovery::Failed(err) => {
                            let b = &mut blocks[i];
                            b.status = BlockStatus::Failed;
                            b.last_error = Some(err.clone());
                            b.timing = Some(timing);
                            self.save_block_and_script(&blocks[i])?;
                            self.manifest.blocks = blocks.clone();
                            self.obs.event(&BuildEvent::BlockFinished {
                                id: blocks[i].id.clone(),
                                ok: false,
                                cached: false,
                                duration: t0.elapsed(),
                                detail: err.clone(),
                            });
                            self.manifest.error =
                                Some(format!("block {} failed: {err}", blocks[i].id));
                            return Ok(());
                        }
                    }
                }
            }
        }
        self.finalize(&blocks, current).await
    }

    /// Resuming a run continues with the repository copy it made. When the
    /// repository has changed since, say so: a new run id builds the new tree.
    async fn warn_if_repo_changed(&mut self) {
        let Some(ws) = self
            .manifest
            .checkpoints
            .iter()
            .find(|c| c.block_id == "workspace")
            .cloned()
        else {
            return;
        };
        let (Some(base), Ok(Some(img))) = (
            self.manifest.base_image.clone(),
            self.rt.image(&ws.image_ref).await,
        ) else {
            return;
        };
        let Some(recorded) = img
            .labels
            .get(cache::KEY_LABEL)
            .filter(|k| !k.is_empty())
            .cloned()
        else {
            return;
        };
        let Ok(base_id) = self.image_id(&base).await else {
            return;
        };
        let (repo, excluded) = (self.repo.clone(), self.excluded.clone());
        let Ok(Ok(tree)) =
            tokio::task::spawn_blocking(move || cache::tree_hash(&repo, &excluded)).await
        else {
            return;
        };
        if cache::workspace_key(&base_id, &tree, &self.env_fingerprint) != recorded {
            self.phase(
                "warning",
                format!(
                    "{} changed since run {} copied it; resuming with that copy (use a new --run-id to build the current tree)",
                    self.repo.display(),
                    self.dir.run_id
                ),
            );
        }
    }

    /// Record a finished block (its status and timing already set): its
    /// checkpoint, block file and script, the manifest, and the event. Returns
    /// the checkpoint, which the next block starts from.
    fn block_done(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        checkpoint: String,
        cached: bool,
        t0: Instant,
        detail: String,
    ) -> Result<String, EnvError> {
        blocks[i].success_checkpoint = Some(checkpoint.clone());
        self.current_checkpoint = Some(checkpoint.clone());
        self.save_block_and_script(&blocks[i])?;
        self.manifest.blocks = blocks.to_vec();
        self.save()?;
        self.obs.event(&BuildEvent::BlockFinished {
            id: blocks[i].id.clone(),
            ok: true,
            cached,
            duration: t0.elapsed(),
            detail,
        });
        Ok(checkpoint)
    }

    /// Put `text` into the container as `name` and run it: the whole-script forms.
    async fn run_whole_script(
        &mut self,
        block: &str,
        phase: &str,
        name: &str,
        text: &str,
    ) -> Result<Result<(), Failure>, EnvError> {
        let path = format!("{SCRIPTS_DIR}/{name}");
        let container = self.container.clone().unwrap_or_default();
        self.rt
            .put_files(
                &container,
                &[(
                    path.clone(),
                    self.redactor.redact(text).into_owned().into_bytes(),
                    0o755,
                )],
            )
            .await?;
        let (out, log) = self
            .exec(
                block,
                phase,
                vec!["bash".into(), path.clone()],
                &format!("bash {path}"),
                self.opts.command_timeout,
                None,
            )
            .await?;
        Ok(if out.success() {
            Ok(())
        } else {
            Err(failure(
                "the whole script",
                &out,
                log,
                self.opts.command_timeout,
            ))
        })
    }

    /// Point the last execution record at the checkpoint it led to.
    fn set_last_checkpoint_after(&mut self, image_ref: &str) {
        if let Some(last) = self.manifest.executions.last_mut() {
            last.checkpoint_after = Some(image_ref.to_string());
        }
    }

    /// `whole-script-forward`: every block in one script, validated block by
    /// block, one checkpoint at the end. `None` when it failed.
    async fn whole_script_forward(
        &mut self,
        blocks: &mut [Block],
        current: &str,
    ) -> Result<Option<String>, EnvError> {
        let t0 = Instant::now();
        self.ensure_container(current).await?;
        let text = script::whole_script(blocks.iter().map(|b| (b.id.as_str(), b.script.as_str())));
        self.phase(
            "whole script",
            format!("{} blocks as one script", blocks.len()),
        );
        if let Err(f) = self
            .run_whole_script("whole-script", "whole_script", "whole-script.sh", &text)
            .await?
        {
            self.phase(
                "whole script",
                format!(
                    "{}: falling back to block-level execution with recovery",
                    f.summary
                ),
            );
            return Ok(None);
        }
        for b in blocks.iter() {
            if let Err(f) = self.run_validation(b, "validation").await? {
                self.phase(
                    "whole script",
                    format!(
                        "validation of {} failed ({}): falling back to block-level execution",
                        b.id, f.summary
                    ),
                );
                return Ok(None);
            }
        }
        let last = blocks.len() as u32;
        let last_id = blocks.last().map(|b| b.id.clone()).unwrap_or_default();
        let cp = self
            .commit(
                &last_id,
                last,
                "success",
                Some(current.to_string()),
                BTreeMap::new(),
            )
            .await?;
        for b in blocks.iter_mut() {
            b.status = BlockStatus::Succeeded;
            b.baseline_checkpoint = Some(current.to_string());
            b.success_checkpoint = Some(cp.image_ref.clone());
            b.timing = Some(BlockTiming {
                total_s: round3(t0.elapsed().as_secs_f64()),
                ..Default::default()
            });
            self.save_block(b)?;
        }
        self.manifest.blocks = blocks.to_vec();
        self.save()?;
        Ok(Some(cp.image_ref))
    }

    async fn finalize(&mut self, blocks: &[Block], current: String) -> Result<(), EnvError> {
        let mut final_source = current;
        let repaired =
            blocks.iter().any(|b| b.status == BlockStatus::Repaired) || self.manifest.repairs > 0;
        if self.opts.ablation.final_clean_replay() {
            if repaired || self.diverged || self.opts.force_clean_replay {
                match self.clean_replay(blocks).await? {
                    Some(img) => final_source = img,
                    None => return Ok(()),
                }
            } else {
                self.manifest.final_clean_replay_ok = Some(true);
                self.manifest.final_clean_replay_image = Some(final_source.clone());
                self.manifest.final_clean_replay_note = Some(
                    "no repair changed the scripts: the forward run executed exactly the final scripts, in order, from the base image (use --force-clean-replay to run them again)".into(),
                );
            }
        } else {
            self.manifest.final_clean_replay_note =
                Some(format!("disabled by --ablation {}", self.opts.ablation));
        }
        let t0 = Instant::now();
        let final_ref = format!("{}:{}-final", self.opts.image_prefix, self.dir.run_id);
        self.rt.tag_image(&final_source, &final_ref).await?;
        self.record(Execution {
            block_id: "finalize".into(),
            phase: "finalize".into(),
            attempt: 1,
            exit_code: Some(0),
            timed_out: false,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            checkpoint_before: Some(final_source.clone()),
            checkpoint_after: Some(final_ref.clone()),
            repair_command: None,
            duration_s: round3(t0.elapsed().as_secs_f64()),
            command: format!("docker tag {final_source} {final_ref}"),
            log_path: None,
            started_at: belay_record::now_rfc3339(),
        })?;
        self.manifest.final_image = Some(final_ref.clone());
        let run_rel = self
            .dir
            .root
            .strip_prefix(&self.repo)
            .ok()
            .map(Path::to_path_buf);
        let base = self
            .manifest
            .base_image
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_IMAGE.into());
        let text = dockerfile::render(
            &self.dir.run_id,
            &base,
            blocks,
            self.trust.ca_bundle.is_some(),
            run_rel.as_deref(),
            &self.excluded,
        );
        belay_record::atomic_write(
            &self.dir.dockerfile(),
            self.redactor.redact(&text).as_bytes(),
        )?;
        self.manifest.dockerfile_path = Some(self.dir.dockerfile());
        if let Some(file) = self.opts.oracle_file.clone() {
            let report = self.run_oracle(&file, &final_ref).await?;
            let ok = report.ok;
            self.manifest.oracle = Some(report);
            if !ok {
                self.manifest.error = Some(format!(
                    "the oracle {} failed on {final_ref}",
                    file.display()
                ));
                return Ok(());
            }
        }
        self.manifest.ok = true;
        Ok(())
    }

    async fn run_oracle(&mut self, file: &Path, image: &str) -> Result<OracleReport, EnvError> {
        let commands = oracle::load(file)?;
        self.phase(
            "oracle",
            format!("{} command(s) from {}", commands.len(), file.display()),
        );
        let mut results = Vec::new();
        for (i, c) in commands.iter().enumerate() {
            let (command, rewritten_from) = if self.opts.oracle_collect_only {
                match oracle::collect_only(&c.command) {
                    Some(r) => (r, Some(c.command.clone())),
                    None => (c.command.clone(), None),
                }
            } else {
                (c.command.clone(), None)
            };
            // A command that passed on this very image before is not run again
            // (the image id pins every byte); --no-cache runs it regardless.
            let image_id = self.image_id(image).await?;
            let pass_file = oracle_cache_file(&self.dir.state_dir, &image_id, &command);
            if self.opts.cache && pass_file.is_file() {
                results.push(OracleCommandResult {
                    oracle_id: c.oracle_id.clone(),
                    command,
                    exit_code: Some(0),
                    timed_out: false,
                    ok: true,
                    duration_s: 0.0,
                    log_path: pass_file,
                    rewritten_from,
                });
                continue;
            }
            // Each command gets a fresh container from the final image, without network.
            let spec = ContainerSpec {
                image: image.to_string(),
                run_id: self.dir.run_id.clone(),
                kind: "oracle".into(),
                network: Network::None,
                env: vec![("HOME".into(), "/root".into())],
                working_dir: Some(REPO_DIR.to_string()),
                ..Default::default()
            };
            let cid = self.rt.create(&spec).await?;
            let log_path = self.dir.log_path("oracle", "oracle", i as u32 + 1);
            let exec = ExecSpec {
                argv: vec!["bash".into(), "-c".into(), command.clone()],
                working_dir: Some(REPO_DIR.to_string()),
                env: vec![],
                timeout: Some(self.opts.oracle_timeout),
                log_path: log_path.clone(),
                log_limit: None,
            };
            let res = self
                .rt
                .exec(&cid, &exec, &self.redactor, &NoopObserver)
                .await;
            self.removals.push(self.rt.remove_detached(&cid));
            let out = res?;
            self.record(Execution {
                block_id: "oracle".into(),
                phase: "oracle".into(),
                attempt: i as u32 + 1,
                exit_code: Some(out.exit_code),
                timed_out: out.timed_out,
                stdout_tail: out.stdout_tail.clone(),
                stderr_tail: out.stderr_tail.clone(),
                checkpoint_before: Some(image.to_string()),
                checkpoint_after: None,
                repair_command: None,
                duration_s: round3(out.duration.as_secs_f64()),
                command: command.clone(),
                log_path: Some(log_path.clone()),
                started_at: belay_record::now_rfc3339(),
            })?;
            if out.success() {
                if let Some(d) = pass_file.parent() {
                    if fs_err::create_dir_all(d).is_ok() {
                        let _ = belay_record::atomic_write(
                            &pass_file,
                            format!("{}\n", log_path.display()).as_bytes(),
                        );
                    }
                }
            }
            results.push(OracleCommandResult {
                oracle_id: c.oracle_id.clone(),
                command,
                exit_code: Some(out.exit_code),
                timed_out: out.timed_out,
                ok: out.success(),
                duration_s: round3(out.duration.as_secs_f64()),
                log_path,
                rewritten_from,
            });
        }
        Ok(OracleReport {
            oracle_file: file.to_path_buf(),
            ok: results.iter().all(|r| r.ok),
            commands: results,
        })
    }

    /// Record the end of the run, whatever happened.
    async fn finish(&mut self, result: Result<(), EnvError>) -> Result<(), EnvError> {
        if let Err(e) = &result {
            self.manifest.error = Some(e.to_string());
            self.manifest.ok = false;
        }
        self.manifest.status = if self.manifest.ok {
            "succeeded"
        } else {
            "failed"
        }
        .into();
        self.manifest.finished_at = Some(belay_record::now_rfc3339());
        self.write_llm_usage()?;
        self.save_final()?;
        self.obs.event(&BuildEvent::Finished {
            ok: self.manifest.ok,
            final_image: self.manifest.final_image.clone(),
            error: self.manifest.error.clone(),
            duration: self.started.elapsed(),
        });
        result
    }
}

/// `<prefix>:<run>-<NNN>-<block>-<kind>`
pub fn checkpoint_ref(prefix: &str, run: &str, seq: u32, block: &str, kind: &str) -> String {
    format!("{prefix}:{run}-{seq:03}-{block}-{kind}")
}

fn start_index_for(
    blocks: &[Block],
    start_at: Option<&str>,
    done: Option<&str>,
    image: &str,
) -> Result<usize, EnvError> {
    match (start_at, done) {
        (Some(id), _) => blocks.iter().position(|b| b.id == id).ok_or_else(|| {
            EnvError::Usage(format!(
                "--start-at-block {id} is not a block of this plan; blocks are: {}",
                blocks.iter().map(|b| b.id.as_str()).collect::<Vec<_>>().join(", ")
            ))
        }),
        (None, Some("workspace")) => Ok(0),
        (None, Some(done)) => blocks.iter().position(|b| b.id == done).map(|i| i + 1).ok_or_else(|| {
            EnvError::Usage(format!(
                "cannot infer where to resume: block {done} (from the image tag) is not in this plan; pass --start-at-block"
            ))
        }),
        (None, None) => Err(EnvError::Usage(format!(
            "cannot infer the completed block from the tag of {image}; pass --start-at-block BLOCK"
        ))),
    }
}

/// Where preflight results are cached: `$BELAY_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/belay`, else `~/.cache/belay`, else `<state-dir>/cache`.
fn preflight_cache_dir(state_dir: &Path) -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("BELAY_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("belay")))
        .or_else(|| env("HOME").map(|h| h.join(".cache").join("belay")))
        .unwrap_or_else(|| state_dir.join("cache"))
}

/// Where a passed oracle command is remembered: keyed by the image id and the
/// command, next to the preflight cache.
fn oracle_cache_file(state_dir: &Path, image_id: &str, command: &str) -> PathBuf {
    use sha2::Digest;
    let key = hex::encode(sha2::Sha256::digest(
        format!("{image_id}\n{command}").as_bytes(),
    ));
    preflight_cache_dir(state_dir)
        .join("oracle")
        .join(format!("{key}.passed"))
}

fn read_context(dir: &RunDir) -> Option<RepoContext> {
    let t = fs_err::read_to_string(dir.context()).ok()?;
    serde_json::from_str(&t).ok()
}

/// Paths (relative to the repo) that are not copied into the container: the
/// state dir, and host build environments that would be wrong inside it.
fn excluded_paths(ctx: &RepoContext, state_rel: Option<&Path>) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(s) = state_rel {
        if !s.as_os_str().is_empty() {
            v.push(s.to_string_lossy().into_owned());
        }
    }
    let root = &ctx.repo_path;
    for p in [".venv", "node_modules"] {
        if root.join(p).exists() {
            v.push(p.to_string());
        }
    }
    if ctx.rust.is_some() && root.join("target").is_dir() {
        v.push("target".into());
    }
    v
}

pub(crate) fn failure(what: &str, out: &ExecOutcome, log: PathBuf, timeout: Duration) -> Failure {
    let summary = if out.timed_out {
        format!(
            "{what} exceeded --command-timeout ({} s) and was killed",
            timeout.as_secs()
        )
    } else {
        let line = last_line(&out.stderr_tail)
            .or_else(|| last_line(&out.stdout_tail))
            .unwrap_or_default();
        format!("{what} exited with {}: {line}", out.exit_code)
    };
    Failure {
        summary,
        log,
        stdout_tail: out.stdout_tail.clone(),
        stderr_tail: out.stderr_tail.clone(),
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(120).collect()
}

fn last_line(s: &str) -> Option<String> {
    s.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(300).collect())
}

pub(crate) fn write_redacted_json<T: serde::Serialize>(
    path: &Path,
    value: &T,
    redactor: &Redactor,
) -> Result<(), EnvError> {
    if redactor.is_empty() {
        return Ok(write_json_atomic(path, value)?);
    }
    let text = serde_json::to_string_pretty(value).map_err(|e| EnvError::BadState {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut red = redactor.redact(&text).into_owned();
    red.push('\n');
    Ok(belay_record::atomic_write(path, red.as_bytes())?)
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checkpoint_tags() {
        assert_eq!(
            parse_checkpoint_tag("myrun-1-003-30-python-deps-success"),
            Some(("myrun-1".into(), 3, "30-python-deps".into()))
        );
        assert_eq!(
            parse_checkpoint_tag("r-000-workspace-success"),
            Some(("r".into(), 0, "workspace".into()))
        );
        assert_eq!(
            parse_checkpoint_tag("r-20261129-104400-ab12-002-10-system-packages-repaired"),
            Some((
                "r-20261129-104400-ab12".into(),
                2,
                "10-system-packages".into()
            ))
        );
        assert_eq!(
            parse_checkpoint_tag("run-123-x-006-50-test-tooling-clean-replay"),
            Some(("run-123-x".into(), 6, "50-test-tooling".into()))
        );
        assert_eq!(parse_checkpoint_tag("r-final"), None);
        assert_eq!(parse_checkpoint_tag("latest"), None);
    }
}
