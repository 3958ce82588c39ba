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

mod checkpoints;
mod container;
mod exec;
#[cfg(test)]
mod fake_tests;
mod finalize;
mod lookups;
mod recover;
mod replay;
mod shared;
mod state;
mod toolchain;

use finalize::*;
use state::*;

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

/// The next block continues in the container while its writable layer (all
/// it changed since it started) is smaller than this...
const KEEP_LAYER_BELOW: i64 = 64 << 20;
/// ...and its last commit took less than this.
const KEEP_COMMIT_BELOW: Duration = Duration::from_secs(1);

/// Label on checkpoint images: the base image the run started from.
pub const BASE_LABEL: &str = "belay.base";
/// Label on checkpoint images: success | repaired | clean-replay.
pub const CHECKPOINT_KIND_LABEL: &str = "belay.checkpoint";
pub use toolchain::TOOLCHAIN_KIND;

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
    let mut ctx = analyze(&opts.repo)?;
    let repo = ctx.repo_path.clone();
    let state_dir = state_dir_for(&repo, opts.state_dir.as_deref());
    // `<repo>/.belay` by default: never through a link the repository ships.
    crate::rundir::check_in_repo(&repo, &state_dir, "--state-dir")?;
    let python = crate::base_suite::choose(ctx.python.as_ref())
        .map(|c| c.python)
        .unwrap_or_default();
    if let Some(py) = ctx.python.as_mut() {
        let hooks = belay_record::state_home().join("no-hooks");
        py.resolve_as_of = crate::as_of::resolve(&repo, &hooks, &opts.resolve_as_of, &python).await;
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
    let registry = match &opts.registry {
        None => None,
        Some(reg) => {
            if !opts.image_prefix.starts_with(&format!("{reg}/")) {
                return Err(EnvError::Usage(format!(
                    "image prefix {} is not in registry {reg}: set the registry with BuildOptions::use_registry",
                    opts.image_prefix
                )));
            }
            let ops = rt.image_registry().ok_or_else(|| {
                EnvError::Usage("this container engine cannot use a registry; --registry needs the Docker Engine API".into())
            })?;
            Some(crate::registry_store::RegistryStore::start(reg, ops))
        }
    };
    let mut run = Run {
        rt,
        registry,
        dir: dir.clone(),
        opts,
        obs,
        redactor,
        exec_log: JsonlAppender::open(&dir.executions())?,
        checkpoint_log: JsonlAppender::open(&dir.checkpoints())?,
        container: None,
        retired: Vec::new(),
        container_image_size: None,
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
        remote_only: HashMap::new(),
        diverged: false,
        current_checkpoint: None,
        llm,
        laid_under: 0,
        made_toolchain: Default::default(),
        package_caches: if opts.package_cache {
            Some(crate::package_cache::PackageCaches::open(
                &preflight_cache_dir(&dir.state_dir),
            )?)
        } else {
            None
        },
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
    let result = opts
        .stop
        .race(run.drive(ctx, prev_blocks))
        .await
        .unwrap_or_else(|why| Err(interrupted(&why.0)));
    let result = run.finish_pushes(result).await;
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
    if matches!(finish, Err(EnvError::Interrupted(_))) {
        // A container whose create was abandoned by the stop is still ours.
        if let Err(e) = belay_sandbox::reaper::remove_own(rt, &run_id).await {
            tracing::warn!("cannot remove the containers of stopped run {run_id}: {e}");
        }
    }
    finish?;
    Ok(BuildOutcome {
        manifest: run.manifest,
        run_dir: dir.root,
    })
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

pub(crate) struct Run<'a> {
    pub(crate) rt: &'a dyn ContainerRuntime,
    pub(crate) dir: RunDir,
    pub(crate) opts: &'a BuildOptions,
    pub(crate) obs: &'a dyn BuildObserver,
    pub(crate) redactor: Redactor,
    pub(crate) trust: HostTrust,
    pub(crate) exec_log: JsonlAppender,
    /// `checkpoints.jsonl`: each checkpoint as it is made, and rollbacks.
    pub(crate) checkpoint_log: JsonlAppender,
    pub(crate) container: Option<String>,
    /// Retired containers, removed in the background once the next container
    /// has started (so that removal never competes with the start).
    pub(crate) retired: Vec<String>,
    /// Size of the image the current container started from (its writable
    /// layer is a checkpoint's size minus this).
    pub(crate) container_image_size: Option<i64>,
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
    /// Checkpoints of this run that are only in the registry (cache hits
    /// read there), with what was read: pulled when a container must start
    /// from one.
    /// The key ref it was read from, and what was read.
    pub(crate) remote_only: HashMap<String, (String, belay_sandbox::registry::RemoteImage)>,
    /// The machine's package caches this build mounts (and its apt slot).
    pub(crate) package_caches: Option<crate::package_cache::PackageCaches>,
    /// The forward state may differ from a clean run of the final scripts
    /// (a repair ran in a live, unrolled-back container).
    pub(crate) diverged: bool,
    /// The checkpoint the current container started from (for records).
    pub(crate) current_checkpoint: Option<String>,
    /// The model client, when planning and repair use a model.
    pub(crate) llm: Option<belay_model::ModelClient>,
    /// The registry store, with `--registry`.
    pub(crate) registry: Option<crate::registry_store::RegistryStore>,
    /// How many leading blocks are under the repository copy.
    pub(crate) laid_under: usize,
    /// The toolchain images this run committed (their reuse is not sharing).
    pub(crate) made_toolchain: std::collections::HashSet<String>,
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
                self.laid_under = self.under_workspace_of(&image).await?;
                let start = start_index_for(
                    &blocks,
                    self.opts.start_at_block.as_deref(),
                    done_block.as_deref(),
                    &image,
                    self.laid_under,
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
                // A toolchain checkpoint lacks the repository: it is copied
                // onto it first, as after the toolchain of a fresh build.
                let image = if self.is_toolchain(&image).await? {
                    self.laid_under = start;
                    self.lay_workspace(&image, &blocks[..start]).await?
                } else {
                    image
                };
                // The flags and the record say what this run's chain is.
                let under = self.laid_under.min(blocks.len());
                for (i, b) in blocks.iter_mut().enumerate() {
                    b.before_workspace = i < under;
                }
                self.manifest.toolchain = (under > 0).then(|| crate::manifest::ToolchainLayers {
                    blocks: blocks[..under].iter().map(|b| b.id.clone()).collect(),
                    shared: self
                        .manifest
                        .toolchain
                        .as_ref()
                        .map(|t| t.shared.clone())
                        .unwrap_or_default(),
                    image: blocks[under - 1]
                        .success_checkpoint
                        .clone()
                        .unwrap_or_default(),
                });
                (blocks, start, Some(image))
            }
            None => {
                let base = self.resolve_base().await?;
                self.share_base(&base).await?;
                self.manifest.base_image = Some(base.clone());
                let base_id = self.image_id(&base).await?;
                // Of the base (the notes are keyed by its id), from a container
                // of it when no earlier run on this machine read them.
                if ctx.runtime_notes.is_none() {
                    ctx.runtime_notes = Some(self.runtime_notes(&base_id, &base).await?);
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
                // The toolchain and the workspace are laid once the plan is saved.
                (blocks, 0, None)
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

        let (start_index, mut current) = match current {
            Some(image) => (start_index, image),
            None => self.lay(&mut blocks).await?,
        };
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
                        .info
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
            self.block_started(&mut blocks, i)?;
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
                    self.after_checkpoint(cp_t0.elapsed(), &cp.image_ref).await;
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
                        recover::Recovery::RollBack(j) if j < self.laid_under => {
                            // The patched block is under the copy: it, and the
                            // blocks after it, move above a new copy.
                            self.retire_container();
                            // The workspace too: it sits on the old toolchain.
                            crate::manifest::retire_checkpoints(&mut self.manifest.checkpoints, 0);
                            self.checkpoint_log.append(
                                &crate::manifest::CheckpointRecord::Retired { retired_from: 0 },
                                &self.redactor,
                            )?;
                            for b in blocks.iter_mut().skip(j) {
                                b.before_workspace = false;
                            }
                            for b in blocks.iter_mut().take(i + 1).skip(j) {
                                b.status = BlockStatus::Planned;
                                b.cached = false;
                            }
                            for b in blocks.iter().skip(j) {
                                self.save_block(b)?;
                            }
                            self.phase(
                                "rollback",
                                format!(
                                    "back to {}, which now runs after the repository copy",
                                    blocks[j].id
                                ),
                            );
                            let (k, ws) = self.lay(&mut blocks).await?;
                            current = ws;
                            self.current_checkpoint = Some(current.clone());
                            self.manifest.blocks = blocks.clone();
                            self.save()?;
                            i = k;
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
                            crate::manifest::retire_checkpoints(
                                &mut self.manifest.checkpoints,
                                first_stale,
                            );
                            self.checkpoint_log.append(
                                &crate::manifest::CheckpointRecord::Retired {
                                    retired_from: first_stale,
                                },
                                &self.redactor,
                            )?;
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
        // The workspace sits on the base, or on the toolchain laid under it.
        let (Some(base), Ok(Some(img))) = (
            ws.parent_image_ref
                .clone()
                .or_else(|| self.manifest.base_image.clone()),
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

    /// Record that block `i` runs now: its file, the manifest, the event.
    pub(super) fn block_started(&mut self, blocks: &mut [Block], i: usize) -> Result<(), EnvError> {
        blocks[i].status = BlockStatus::Running;
        blocks[i].cached = false;
        self.save_block(&blocks[i])?;
        self.manifest.blocks = blocks.to_vec();
        self.save()?;
        self.obs.event(&BuildEvent::BlockStarted {
            id: blocks[i].id.clone(),
            title: blocks[i].title.clone(),
            index: i,
            total: blocks.len(),
        });
        Ok(())
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
}

/// `<prefix>:<run>-<NNN>-<block>-<kind>`
pub fn checkpoint_ref(prefix: &str, run: &str, seq: u32, block: &str, kind: &str) -> String {
    format!("{prefix}:{run}-{seq:03}-{block}-{kind}")
}

/// Where a resumed build starts: `under` blocks are under the workspace copy.
fn start_index_for(
    blocks: &[Block],
    start_at: Option<&str>,
    done: Option<&str>,
    image: &str,
    under: usize,
) -> Result<usize, EnvError> {
    match (start_at, done) {
        (Some(id), _) => blocks.iter().position(|b| b.id == id).ok_or_else(|| {
            EnvError::Usage(format!(
                "--start-at-block {id} is not a block of this plan; blocks are: {}",
                blocks.iter().map(|b| b.id.as_str()).collect::<Vec<_>>().join(", ")
            ))
        }),
        (None, Some("workspace")) => Ok(under.min(blocks.len())),
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
