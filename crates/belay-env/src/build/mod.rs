//! `belay env build`: the checkpointed block loop.
//!
//! [`build`] opens the run (analysis, run directory, lock, event log), then
//! drives it through four phases (`Run::drive`):
//!
//! 1. Resume or fresh ([`start`]): resume from the last checkpoint that still
//!    exists on the engine (or `--resume-from`), or resolve the base image
//!    (given, built from a Dockerfile through the Engine API, or the
//!    default), run the container preflight (`runtime_notes`) and plan (or
//!    reuse the run's `blocks/*.json`).
//! 2. The toolchain ([`toolchain`]): the leading blocks that read nothing of
//!    the repository, shared between projects, then the repository copied in
//!    and committed as the workspace checkpoint.
//! 3. The blocks ([`blocks`]): each block and its validation; after each
//!    success a checkpoint `<prefix>:<run>-<NNN>-<block>-success`. A failing
//!    block is repaired ([`recover`]) from its baseline checkpoint and replayed.
//! 4. Finalize ([`finalize`]): the clean replay ([`replay`]) when repairs
//!    changed the scripts, the final tag, the Dockerfile, the oracle.
//!
//! Checkpoints are also a cache: a block whose parent image and script match an
//! earlier checkpoint on the same engine reuses it without running.
//!
//! `Run` is the run's shared context (the engine, options, observer,
//! redactor, host trust, repository context and manifest) and the parts that
//! own their state: the [`pool::ContainerPool`] (the build container and the
//! retired ones), the [`checkpoints::CheckpointStore`] (checkpoint names, ids,
//! the checkpoint log, the cache and the registry) and the
//! [`records::Records`] (the execution log, attempt numbers, and the writing
//! of the manifest, blocks and scripts).
//!
//! State (manifest, blocks, executions) is written atomically after every
//! transition, so rerunning the same command with the same run id after a crash
//! resumes from the last checkpoint that still exists on the engine.

mod blocks;
mod checkpoints;
mod container;
mod exec;
mod finalize;
mod lookups;
mod pool;
mod records;
mod recover;
mod replay;
mod start;
mod state;
mod toolchain;

use checkpoints::{CacheHit, CheckpointStore};
use finalize::*;
use pool::ContainerPool;
use records::Records;
use start::Start;
use state::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belay_record::{run_id, write_json_atomic, OpenRun, Redactor, RunHandle};
use belay_sandbox::reaper::reap_orphans;
use belay_sandbox::trust::HostTrust;
use belay_sandbox::{
    bootstrap::DEFAULT_BASE_IMAGE, labels, BuildRequest, ContainerRuntime, ContainerSpec,
    ExecOutcome, ExecSpec, Network, NoopObserver, SandboxError, TarFilter,
};

use crate::ablation::{Ablation, Granularity};
use crate::analyze::{analyze, RepoContext};
use crate::manifest::{Checkpoint, Execution, Manifest, OracleCommandResult, OracleReport};
use crate::plan::{plan_rules, Block, BlockStatus, BlockTiming, REPO_DIR, SCRIPTS_DIR};
use crate::preflight::{self, RuntimeNotes};
use crate::progress::{BlockOutput, BuildEvent, BuildObserver};
use crate::rundir::RunDir;
use crate::{cache, dockerfile, oracle, script, EnvError};

pub use crate::checkpoint_names::{
    checkpoint_ref, parse_checkpoint_tag, BASE_LABEL, CHECKPOINT_KIND_LABEL, TOOLCHAIN_KIND,
};
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
    /// Mount the machine's package download caches into build containers
    /// (`--no-package-cache` turns it off).
    pub package_cache: bool,
    /// Replay the final scripts even when the forward run already was one.
    pub force_clean_replay: bool,
    /// Plan and repair with this model (the rules stay the fallback).
    pub llm: Option<belay_model::ModelSetup>,
    /// Share checkpoints and the cache through this OCI registry
    /// (`host[:port][/prefix]`); set with [`BuildOptions::use_registry`].
    pub registry: Option<String>,
    /// With a registry: pull a final image that is only there (every block
    /// a cache hit read in the registry) onto this engine. A cluster's
    /// worker leaves it in the registry, where the submitter reads it.
    pub pull_final: bool,
    /// The date Python dependencies resolve as of (`as_of.rs`).
    pub resolve_as_of: crate::as_of::AsOfChoice,
    /// The scope toolchain checkpoints are shared in under `--no-cache`
    /// (a batch sets one for all its projects); the run id when unset.
    pub cache_scope: Option<String>,
    /// The one cancellation token: when it trips, the block running is
    /// abandoned, the container removed and the build recorded as
    /// interrupted; the same command resumes from the last checkpoint.
    pub stop: belay_record::Stop,
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
            max_repair_attempts: 3,
            max_probe_failures: 5,
            cache: true,
            package_cache: true,
            force_clean_replay: false,
            llm: None,
            registry: None,
            pull_final: true,
            resolve_as_of: crate::as_of::AsOfChoice::Source,
            cache_scope: None,
            stop: belay_record::Stop::new(),
        }
    }

    /// Keep checkpoints in `registry` too: image names move under it
    /// (`<registry>/<prefix>:<run>-<NNN>-<block>-<kind>`), so that every
    /// checkpoint can be pushed under its own name.
    pub fn use_registry(&mut self, registry: &str) -> Result<(), EnvError> {
        let reg = belay_sandbox::registry::parse_registry(registry)?;
        if belay_sandbox::registry::registry_host(&self.image_prefix).is_some() {
            return Err(EnvError::Usage(format!(
                "--image-prefix {} already names a registry; with --registry {reg} give a plain prefix (like belay)",
                self.image_prefix
            )));
        }
        self.image_prefix = format!("{reg}/{}", self.image_prefix);
        self.registry = Some(reg);
        Ok(())
    }
}

/// The result of a build that ran (successfully or not).
#[derive(Debug)]
pub struct BuildOutcome {
    pub manifest: Manifest,
    pub run_dir: PathBuf,
}

/// Resolve the state dir: `--state-dir`, else `<repo>/.belay`. One inside the
/// repository is checked before use ([`crate::rundir::check_in_repo`]).
pub fn state_dir_for(repo: &Path, state_dir: Option<&Path>) -> PathBuf {
    match state_dir {
        Some(s) => s.to_path_buf(),
        None => repo.join(".belay"),
    }
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
    let (ctx, setup) = prepare(opts).await?;
    // The run's directory, lock, event log and registry record, opened the
    // one way every mode opens its runs.
    let handle = open_handle(&setup.dir, &setup.redactor, &ctx.repo_path)?;
    let recorder = crate::progress::Recorder::new(obs, &handle);
    let obs: &dyn BuildObserver = &recorder;
    reap(rt, obs).await?;
    let (mut run, prev_blocks) = Run::open(rt, opts, obs, setup, &ctx, started)?;
    let head = repo_head(&ctx.repo_path).await;
    let result = opts
        .stop
        .race(run.drive(ctx, prev_blocks))
        .await
        .unwrap_or_else(|why| Err(interrupted(&why.0)));
    let result = run.finish_pushes(result).await;
    let finish = run.finish(result).await;
    run.release_containers().await;
    if matches!(finish, Err(EnvError::Interrupted(_))) {
        // A container whose create was abandoned by the stop is still ours.
        let run_id = &run.dir.run_id;
        if let Err(e) = belay_sandbox::reaper::remove_own(rt, run_id).await {
            tracing::warn!("cannot remove the containers of stopped run {run_id}: {e}");
        }
    }
    finish?;
    // The final image for the other modes: by id, with the commit it was
    // built from (`sandbox_image` checks both before it uses the image).
    if run.manifest.ok {
        if let Some(img) = &run.manifest.final_image {
            if let Ok(Some(info)) = rt.image(img).await {
                handle.artifact(&info.id, head.as_deref());
            }
        }
    }
    Ok(BuildOutcome {
        manifest: run.manifest,
        run_dir: run.dir.root,
    })
}

/// The commit the repository's work tree is at, when it is a git work
/// tree (through belay's hardened git: no hooks, a deadline).
pub async fn repo_head(repo: &Path) -> Option<String> {
    let hooks = belay_record::no_hooks_dir();
    let git = belay_vcs::Git::open(repo, &hooks).await.ok()?;
    git.head().await.ok()
}

/// A run's directory and what its records pass through, before it is opened.
struct Setup {
    dir: RunDir,
    trust: HostTrust,
    redactor: Redactor,
}

/// Analyse the repository (and the date its Python and node dependencies
/// resolve as of), and make the run's directory; the host's trust and its secrets.
async fn prepare(opts: &BuildOptions) -> Result<(RepoContext, Setup), EnvError> {
    let mut ctx = analyze(&opts.repo)?;
    let repo = ctx.repo_path.clone();
    let state_dir = state_dir_for(&repo, opts.state_dir.as_deref());
    // `<repo>/.belay` by default: never through a link the repository ships.
    crate::rundir::check_in_repo(&repo, &state_dir, "--state-dir")?;
    let python = crate::base_suite::choose(ctx.python.as_ref())
        .map(|c| c.python)
        .unwrap_or_default();
    let hooks = belay_record::no_hooks_dir();
    if let Some(py) = ctx.python.as_mut() {
        py.resolve_as_of = crate::as_of::resolve(&repo, &hooks, &opts.resolve_as_of, &python).await;
    }
    if let Some(node) = ctx.node.as_mut() {
        crate::as_of::date_node(node, &repo, &hooks, &opts.resolve_as_of).await;
    }
    let run_id = match &opts.run_id {
        Some(id) => {
            run_id::validate(id)?;
            id.clone()
        }
        None => run_id::generate(&ctx.repo_name),
    };
    let dir = RunDir::new(&state_dir, &run_id);
    dir.check_in_repo(&repo)?;
    dir.create()?;
    let trust = if opts.host_trust {
        HostTrust::detect()
    } else {
        HostTrust::none()
    };
    let mut redactor = opts.redactor.clone();
    trust.register_secrets(&mut redactor);
    Ok((
        ctx,
        Setup {
            dir,
            trust,
            redactor,
        },
    ))
}

/// Open the run's handle: its lock (one process per run id), event log and
/// registry record.
fn open_handle(dir: &RunDir, redactor: &Redactor, repo: &Path) -> Result<RunHandle, EnvError> {
    let run_id = &dir.run_id;
    RunHandle::open(OpenRun {
        dir: dir.root.clone(),
        id: run_id,
        mode: belay_record::Mode::Env,
        title: None,
        repo: Some(repo),
        redactor: redactor.clone(),
        registry: belay_record::Registry::default_location(),
    })
    .map_err(|e| match e {
        belay_record::RecordError::Locked { .. } => EnvError::Usage(format!(
            "run {run_id} is already in progress in another belay process (lock {}); wait for it or pick another --run-id",
            dir.lock().display()
        )),
        other => other.into(),
    })
}

/// Remove the containers of belay processes that are gone.
async fn reap(rt: &dyn ContainerRuntime, obs: &dyn BuildObserver) -> Result<(), EnvError> {
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
    Ok(())
}

/// The build was stopped by the one token (`BuildOptions::stop`).
pub(crate) fn interrupted(why: &str) -> EnvError {
    EnvError::Interrupted(format!(
        "{why}: the build stopped; its checkpoints are kept and the same command resumes it"
    ))
}

/// A failed block step: what failed, and where its full output is.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub summary: String,
    pub log: PathBuf,
    pub stdout_tail: String,
    pub stderr_tail: String,
}

/// One build: the shared context every phase reads, the manifest every
/// phase fills in, and the parts that own their state.
pub(crate) struct Run<'a> {
    pub(crate) rt: &'a dyn ContainerRuntime,
    pub(crate) dir: RunDir,
    pub(crate) opts: &'a BuildOptions,
    pub(crate) obs: &'a dyn BuildObserver,
    pub(crate) redactor: Redactor,
    pub(crate) trust: HostTrust,
    pub(crate) ctx: RepoContext,
    pub(crate) manifest: Manifest,
    /// The build container, and the retired ones going away.
    pub(crate) pool: ContainerPool<'a>,
    /// This run's checkpoints: names, ids, the log, the cache, the registry.
    pub(crate) store: CheckpointStore<'a>,
    /// The execution log and attempt numbers; writes the manifest, blocks
    /// and scripts.
    pub(crate) records: Records,
    pub(crate) repo: PathBuf,
    /// Paths (relative to the repo) not copied into the container.
    pub(crate) excluded: Vec<String>,
    /// What containers see besides their image (for cache keys).
    pub(crate) env_fingerprint: String,
    /// The machine's package caches this build mounts (and its apt slot).
    pub(crate) package_caches: Option<crate::package_cache::PackageCaches>,
    /// The forward state may differ from a clean run of the final scripts
    /// (a repair ran in a live, unrolled-back container).
    pub(crate) diverged: bool,
    /// The model client, when planning and repair use a model.
    pub(crate) llm: Option<belay_model::ModelClient>,
    /// How many leading blocks are under the repository copy.
    pub(crate) laid_under: usize,
}

impl<'a> Run<'a> {
    /// Open the run in `setup`: what an earlier start of it left (its
    /// manifest and blocks, returned), the model client, the registry store,
    /// the logs and the package caches.
    fn open(
        rt: &'a dyn ContainerRuntime,
        opts: &'a BuildOptions,
        obs: &'a dyn BuildObserver,
        setup: Setup,
        ctx: &RepoContext,
        started: Instant,
    ) -> Result<(Self, Option<Vec<Block>>), EnvError> {
        let Setup {
            dir,
            trust,
            redactor,
        } = setup;
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
        let registry = open_registry(rt, opts)?;
        let records = Records::open(&dir, &redactor, previous.as_ref(), started)?;
        let store = CheckpointStore::open(rt, &dir, &opts.image_prefix, registry)?;
        let manifest = new_manifest(&dir, &ctx.repo_path, previous.as_ref(), opts);
        let package_caches = if opts.package_cache {
            Some(crate::package_cache::PackageCaches::open(
                &preflight_cache_dir(&dir.state_dir),
            )?)
        } else {
            None
        };
        let run = Run {
            rt,
            dir,
            opts,
            obs,
            redactor,
            trust,
            ctx: ctx.clone(),
            manifest,
            pool: ContainerPool::new(rt),
            store,
            records,
            repo: ctx.repo_path.clone(),
            excluded: Vec::new(),
            env_fingerprint: String::new(),
            package_caches,
            diverged: false,
            llm,
            laid_under: 0,
        };
        Ok((run, prev_blocks))
    }

    /// The build, phase by phase: resume or start fresh, lay the toolchain,
    /// run the blocks, finalize. A block that fails for good ends it before
    /// finalize (the manifest says why).
    async fn drive(
        &mut self,
        ctx: RepoContext,
        prev_blocks: Option<Vec<Block>>,
    ) -> Result<(), EnvError> {
        let mut start: Start = self.resume_or_fresh(ctx, prev_blocks).await?;
        let (first, current) = self.toolchain(&mut start).await?;
        let blocks = &mut start.blocks;
        match self.run_blocks(blocks, first, current).await? {
            Some(last) => self.finalize(blocks, last).await,
            None => Ok(()),
        }
    }
}

/// The registry store of `--registry`, started.
fn open_registry(
    rt: &dyn ContainerRuntime,
    opts: &BuildOptions,
) -> Result<Option<crate::registry_store::RegistryStore>, EnvError> {
    let Some(reg) = &opts.registry else {
        return Ok(None);
    };
    if !opts.image_prefix.starts_with(&format!("{reg}/")) {
        return Err(EnvError::Usage(format!(
            "image prefix {} is not in registry {reg}: set the registry with BuildOptions::use_registry",
            opts.image_prefix
        )));
    }
    let ops = rt.image_registry().ok_or_else(|| {
        EnvError::Usage(
            "this container engine cannot use a registry; --registry needs the Docker Engine API"
                .into(),
        )
    })?;
    Ok(Some(crate::registry_store::RegistryStore::start(reg, ops)))
}

/// What needs more than one part of the run.
impl Run<'_> {
    /// Write the interim manifest.
    pub(crate) fn save(&mut self) -> Result<(), EnvError> {
        self.records.save(&mut self.manifest)
    }

    /// Record an execution: the log, the manifest, the event.
    pub(crate) fn record(&mut self, exec: Execution) -> Result<(), EnvError> {
        self.records.record(&mut self.manifest, self.obs, exec)
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
        let attempt = self.records.next_attempt(block, phase);
        self.record(Execution {
            block_id: block.to_string(),
            phase: phase.to_string(),
            attempt,
            exit_code: Some(if ok { 0 } else { 1 }),
            timed_out: false,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            checkpoint_before: self.pool.checkpoint(),
            checkpoint_after: None,
            repair_command: None,
            duration_s: round3(took.as_secs_f64()),
            command: what.to_string(),
            log_path: None,
            started_at: belay_record::now_rfc3339(),
        })
    }

    pub(crate) fn phase(&self, name: &str, detail: impl Into<String>) {
        self.obs.event(&BuildEvent::Phase {
            name: name.into(),
            detail: detail.into(),
        });
    }

    /// A checkpoint made or adopted: reported, logged, and in the manifest.
    pub(crate) fn push_checkpoint(&mut self, cp: Checkpoint) {
        self.obs.event(&BuildEvent::Checkpoint {
            block: cp.block_id.clone(),
            image_ref: cp.image_ref.clone(),
            kind: cp.kind.clone(),
            cached: cp.cached_from.is_some(),
        });
        self.store.log(&cp, &self.redactor);
        crate::manifest::add_checkpoint(&mut self.manifest.checkpoints, cp);
    }

    /// Checkpoints from `from` on are stale (a rollback): a resume must not
    /// pick them.
    pub(crate) fn retire_checkpoints(&mut self, from: u32) -> Result<(), EnvError> {
        self.store
            .retire_from(from, &mut self.manifest.checkpoints, &self.redactor)
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
        let container = self.pool.require()?;
        let base = self.manifest.base_image.clone();
        let cp = self
            .store
            .commit(
                &container,
                (seq, block, kind),
                base.as_deref(),
                parent,
                extra_labels,
            )
            .await?;
        self.push_checkpoint(cp.clone());
        Ok(cp)
    }

    /// Adopt a cached checkpoint as this run's checkpoint `seq` for `block`.
    pub(crate) async fn adopt_cached(
        &mut self,
        hit: CacheHit,
        block: &str,
        seq: u32,
        parent: Option<String>,
    ) -> Result<Checkpoint, EnvError> {
        let cp = self.store.adopt(hit, seq, block, parent).await?;
        self.push_checkpoint(cp.clone());
        self.manifest.cache.hits += 1;
        Ok(cp)
    }

    /// Cache key of `block` on top of `parent`.
    pub(crate) async fn block_key(
        &mut self,
        block: &Block,
        parent: &str,
    ) -> Result<String, EnvError> {
        let parent_id = self.store.image_id(parent).await?;
        Ok(cache::block_key(
            &parent_id,
            &block.id,
            &block.script,
            &block.validation_command,
            &self.env_fingerprint,
        ))
    }
}

/// What failed, from its exit (or timeout) and the last line of its output.
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
mod fake_tests;
