//! `belay env build`: the checkpointed block loop.
//!
//! 1. Analyse the repository; resolve the base image (given, built from a
//!    Dockerfile through the Engine API, or the default).
//! 2. Start a container, copy the repository to `/workspace/repo` as a tar
//!    stream, and run the container preflight (`runtime_notes`).
//! 3. Plan blocks from the context and the runtime notes (or reuse the run's
//!    `blocks/*.json`), and commit the copied workspace as the first checkpoint.
//! 4. Run each block and its validation in the same container; after each
//!    success commit a checkpoint `<prefix>:<run>-<NNN>-<block>-success`.
//! 5. Finalize: tag the final image, write the Dockerfile, run the oracle.
//!
//! State (manifest, blocks, executions) is written atomically after every
//! transition, so rerunning the same command with the same run id after a crash
//! resumes from the last checkpoint that still exists on the engine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belay_record::{run_id, write_json_atomic, JsonlAppender, Redactor, RunLock};
use belay_sandbox::reaper::reap_orphans;
use belay_sandbox::trust::HostTrust;
use belay_sandbox::{
    bootstrap::DEFAULT_BASE_IMAGE, labels, BuildRequest, ContainerRuntime, ContainerSpec,
    ExecOutcome, ExecSpec, Network, NoopObserver, SandboxError, TarFilter,
};

use crate::analyze::{analyze, RepoContext};
use crate::manifest::{
    Checkpoint, Execution, LlmUsage, Manifest, OracleCommandResult, OracleReport, ProgressControl,
};
use crate::plan::{plan_rules, Block, BlockStatus, BlockTiming, REPO_DIR};
use crate::preflight::{self, RuntimeNotes};
use crate::progress::{BlockOutput, BuildEvent, BuildObserver};
use crate::rundir::RunDir;
use crate::{dockerfile, oracle, EnvError};

/// A commit faster than this means the container's writable layer is small
/// enough to keep using it (about what starting a fresh container costs).
const KEEP_CONTAINER_BELOW: Duration = Duration::from_millis(250);

/// Label on checkpoint images: the base image the run started from.
pub const BASE_LABEL: &str = "belay.base";

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
    pub resume_from: Option<String>,
    pub start_at_block: Option<String>,
    /// Network of the build container (package installs need one).
    pub network: Network,
    /// Inherit the host's CA bundle and proxy settings.
    pub host_trust: bool,
    /// Secrets to scrub from everything written.
    pub redactor: Redactor,
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
            resume_from: None,
            start_at_block: None,
            network: Network::Bridge,
            host_trust: true,
            redactor: Redactor::default(),
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
    let _lock = RunLock::acquire(&dir.lock()).map_err(|e| match e {
        belay_record::RecordError::Locked { .. } => EnvError::Usage(format!(
            "run {run_id} is already in progress in another belay process (lock {}); wait for it or pick another --run-id",
            dir.lock().display()
        )),
        other => other.into(),
    })?;

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

    let trust = if opts.host_trust {
        HostTrust::detect()
    } else {
        HostTrust::none()
    };
    let mut redactor = opts.redactor.clone();
    trust.register_secrets(&mut redactor);

    let previous = read_manifest(&dir)?;
    let prev_blocks = read_blocks(&dir)?;
    let mut run = Run {
        rt,
        dir: dir.clone(),
        opts,
        obs,
        redactor,
        trust,
        exec_log: JsonlAppender::open(&dir.executions())?,
        container: None,
        retired: Vec::new(),
        removals: Vec::new(),
        manifest: new_manifest(&dir, &repo, previous.as_ref()),
        started,
        repo,
        excluded: Vec::new(),
    };
    let result = run.drive(ctx, prev_blocks).await;
    let finish = run.finish(result).await;
    for c in run.retired.drain(..) {
        run.removals.push(rt.remove_detached(&c));
    }
    for h in run.removals.drain(..) {
        let _ = h.await;
    }
    if let Some(c) = run.container.take() {
        if !opts.keep_container {
            let _ = rt.remove(&c).await;
        }
    }
    finish?;
    Ok(BuildOutcome {
        manifest: run.manifest,
        run_dir: dir.root,
    })
}

fn read_manifest(dir: &RunDir) -> Result<Option<Manifest>, EnvError> {
    let p = dir.manifest();
    match std::fs::read_to_string(&p) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| EnvError::BadState {
                path: p,
                message: format!("{e}; move the run directory away or pick another --run-id"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EnvError::io("cannot read", p, e)),
    }
}

fn read_blocks(dir: &RunDir) -> Result<Option<Vec<Block>>, EnvError> {
    let d = dir.blocks_dir();
    let mut blocks = Vec::new();
    let rd = match std::fs::read_dir(&d) {
        Ok(rd) => rd,
        Err(_) => return Ok(None),
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            let t = std::fs::read_to_string(&p).map_err(|e| EnvError::io("cannot read", &p, e))?;
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

fn new_manifest(dir: &RunDir, repo: &Path, previous: Option<&Manifest>) -> Manifest {
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
        llm_usage: LlmUsage {
            planner: "rules".into(),
            ..Default::default()
        },
        ablation_mode: "forward-only".into(),
        progress_control: ProgressControl::forward_only(),
        final_clean_replay_enabled: false,
        final_clean_replay_ok: None,
        final_clean_replay_image: None,
        final_clean_replay_failure_stage: None,
        oracle: None,
        blocks: vec![],
        checkpoints: previous.map(|p| p.checkpoints.clone()).unwrap_or_default(),
        executions: previous.map(|p| p.executions.clone()).unwrap_or_default(),
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

/// How a block step ended.
enum Step {
    Ok,
    Failed(String),
}

struct Run<'a> {
    rt: &'a dyn ContainerRuntime,
    dir: RunDir,
    opts: &'a BuildOptions,
    obs: &'a dyn BuildObserver,
    redactor: Redactor,
    trust: HostTrust,
    exec_log: JsonlAppender,
    container: Option<String>,
    /// Retired containers, removed in the background once the next container
    /// has started (so that removal never competes with the start).
    retired: Vec<String>,
    /// Removals of retired containers, running in the background.
    removals: Vec<tokio::task::JoinHandle<()>>,
    manifest: Manifest,
    started: Instant,
    repo: PathBuf,
    /// Paths (relative to the repo) not copied into the container.
    excluded: Vec<String>,
}

impl Run<'_> {
    fn save(&mut self) -> Result<(), EnvError> {
        self.manifest.duration_s = round3(self.started.elapsed().as_secs_f64());
        write_redacted_json(&self.dir.manifest(), &self.manifest, &self.redactor)?;
        Ok(())
    }

    fn save_blocks(&self, blocks: &[Block]) -> Result<(), EnvError> {
        for b in blocks {
            write_redacted_json(
                &self.dir.blocks_dir().join(format!("{}.json", b.id)),
                b,
                &self.redactor,
            )?;
            belay_record::atomic_write(
                &self.dir.scripts_dir().join(format!("{}.sh", b.id)),
                self.redactor.redact(&b.script).as_bytes(),
            )?;
        }
        Ok(())
    }

    fn record(&mut self, exec: Execution) -> Result<(), EnvError> {
        self.exec_log.append(&exec, &self.redactor)?;
        self.manifest.executions.push(exec);
        Ok(())
    }

    fn phase(&self, name: &str, detail: impl Into<String>) {
        self.obs.event(&BuildEvent::Phase {
            name: name.into(),
            detail: detail.into(),
        });
    }

    /// Run `argv` in the build container, log it, and record an execution.
    #[allow(clippy::too_many_arguments)]
    async fn exec(
        &mut self,
        block: &str,
        phase: &str,
        attempt: u32,
        argv: Vec<String>,
        display: &str,
        timeout: Duration,
        checkpoint_before: Option<String>,
    ) -> Result<ExecOutcome, EnvError> {
        let container = self
            .container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))?;
        let log_path = self.dir.log_path(block, phase, attempt);
        let started_at = belay_record::now_rfc3339();
        let spec = ExecSpec {
            argv,
            working_dir: Some(REPO_DIR.to_string()),
            env: vec![],
            timeout: Some(timeout),
            log_path: log_path.clone(),
        };
        let observer = BlockOutput {
            block,
            observer: self.obs,
        };
        let out = self
            .rt
            .exec(&container, &spec, &self.redactor, &observer)
            .await?;
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
            repair_command: None,
            duration_s: round3(out.duration.as_secs_f64()),
            command: display.to_string(),
            log_path: Some(log_path),
            started_at,
        })?;
        Ok(out)
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
                let log_path = self.dir.log_path("docker_build", "docker_build", 1);
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
                            context_dir: context,
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
                    attempt: 1,
                    exit_code: code,
                    timed_out: matches!(res, Err(SandboxError::BuildTimeout { .. })),
                    stdout_tail: String::new(),
                    stderr_tail: err,
                    checkpoint_before: None,
                    checkpoint_after: res.as_ref().ok().map(|_| tag.clone()),
                    repair_command: None,
                    duration_s: round3(t0.elapsed().as_secs_f64()),
                    command: format!(
                        "docker build -f {} {}",
                        df.display(),
                        df.parent().unwrap_or(Path::new(".")).display()
                    ),
                    log_path: Some(log_path),
                    started_at: belay_record::now_rfc3339(),
                })?;
                res?;
                Ok(tag)
            }
        }
    }

    async fn start_container(&mut self, image: &str) -> Result<(), EnvError> {
        let mut env = self.trust.container_env();
        env.push(("HOME".into(), "/root".into()));
        let spec = ContainerSpec {
            image: image.to_string(),
            run_id: self.dir.run_id.clone(),
            kind: "env-build".into(),
            network: self.opts.network,
            env,
            working_dir: Some(REPO_DIR.to_string()),
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

    async fn commit(
        &mut self,
        block: &str,
        seq: u32,
        kind: &str,
        parent: Option<String>,
    ) -> Result<Checkpoint, EnvError> {
        let container = self
            .container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))?;
        let image_ref = format!(
            "{}:{}-{seq:03}-{block}-{kind}",
            self.opts.image_prefix, self.dir.run_id
        );
        let mut lbl = BTreeMap::new();
        lbl.insert(labels::RUN.to_string(), self.dir.run_id.clone());
        lbl.insert(labels::KIND.to_string(), "checkpoint".to_string());
        lbl.insert(labels::BLOCK.to_string(), block.to_string());
        if let Some(base) = &self.manifest.base_image {
            lbl.insert(BASE_LABEL.to_string(), base.clone());
        }
        let image_id = self.rt.commit(&container, &image_ref, &lbl).await?;
        let cp = Checkpoint {
            id: format!("{seq:03}-{block}"),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: parent,
            kind: kind.to_string(),
            image_id,
            created_at: belay_record::now_rfc3339(),
        };
        self.manifest.checkpoints.retain(|c| c.id != cp.id);
        self.manifest.checkpoints.push(cp.clone());
        Ok(cp)
    }

    /// Where to start: (image to start from, index of the first block to run,
    /// whether the image already holds the workspace).
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
            let inferred =
                crate::build::parse_checkpoint_tag(belay_sandbox::split_image_ref(img).1)
                    .map(|t| t.2);
            return Ok(Some((img.clone(), inferred)));
        }
        if blocks.is_none() {
            return Ok(None);
        }
        // Same run id: the newest recorded checkpoint that still exists.
        let mut cps = self.manifest.checkpoints.clone();
        cps.sort_by_key(|c| c.id.clone());
        for cp in cps.iter().rev() {
            if (cp.kind == "success" || cp.kind == "repaired")
                && self.rt.image_exists(&cp.image_ref).await?
            {
                return Ok(Some((cp.image_ref.clone(), Some(cp.block_id.clone()))));
            }
        }
        Ok(None)
    }

    async fn drive(
        &mut self,
        mut ctx: RepoContext,
        prev_blocks: Option<Vec<Block>>,
    ) -> Result<(), EnvError> {
        self.manifest.host_trust = self.trust.enabled();
        if self.trust.enabled() {
            if let Some(ca) = &self.trust.ca_bundle {
                belay_record::atomic_write(&self.dir.ca_bundle(), ca)?;
            }
        }
        let state_rel = self
            .dir
            .state_dir
            .strip_prefix(&self.repo)
            .ok()
            .map(Path::to_path_buf);
        self.excluded = excluded_paths(&ctx, state_rel.as_deref());

        let resume = self.resume_point(prev_blocks.as_ref()).await?;
        self.obs.event(&BuildEvent::RunStarted {
            run_id: self.dir.run_id.clone(),
            run_dir: self.dir.root.display().to_string(),
            resumed_from: resume.as_ref().map(|r| r.0.clone()),
        });

        let (mut blocks, start_index, mut current) = match resume {
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
                self.start_container(&image).await?;
                let notes = match read_context(&self.dir).and_then(|c| c.runtime_notes) {
                    Some(n) => n,
                    None => {
                        let n = self.preflight().await?;
                        ctx.runtime_notes = Some(n.clone());
                        write_redacted_json(&self.dir.context(), &ctx, &self.redactor)?;
                        n
                    }
                };
                // The same run id reuses its blocks; another run's checkpoint is
                // planned for from what the image really has.
                let mut blocks = match prev_blocks {
                    Some(b) => b,
                    None => plan_rules(&ctx, &notes)?,
                };
                let start = match (&self.opts.start_at_block, done_block) {
                    (Some(id), _) => blocks.iter().position(|b| &b.id == id).ok_or_else(|| {
                        EnvError::Usage(format!(
                            "--start-at-block {id} is not a block of this plan; blocks are: {}",
                            blocks.iter().map(|b| b.id.as_str()).collect::<Vec<_>>().join(", ")
                        ))
                    })?,
                    (None, Some(done)) if done == "workspace" => 0,
                    (None, Some(done)) => match blocks.iter().position(|b| b.id == done) {
                        Some(i) => i + 1,
                        None => {
                            return Err(EnvError::Usage(format!(
                                "cannot infer where to resume: block {done} (from the image tag) is not in this plan; pass --start-at-block"
                            )))
                        }
                    },
                    (None, None) => {
                        return Err(EnvError::Usage(format!(
                            "cannot infer the completed block from the tag of {image}; pass --start-at-block BLOCK"
                        )))
                    }
                };
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
                (blocks, start, Some(image))
            }
            None => {
                let base = self.resolve_base().await?;
                self.manifest.base_image = Some(base.clone());
                self.phase("container", format!("starting from {base}"));
                self.start_container(&base).await?;
                let container = self.container.clone().unwrap_or_default();
                let files = self.trust.container_files();
                if !files.is_empty() {
                    self.rt.put_files(&container, &files).await?;
                }
                self.phase("copy", format!("{} -> {REPO_DIR}", self.repo.display()));
                let filter = TarFilter {
                    exclude: self.excluded.iter().map(PathBuf::from).collect(),
                };
                self.rt
                    .copy_dir_in(&container, &self.repo, REPO_DIR, &filter)
                    .await?;
                ctx.runtime_notes = Some(self.preflight().await?);
                write_redacted_json(&self.dir.context(), &ctx, &self.redactor)?;
                let blocks = match prev_blocks {
                    Some(b) => {
                        self.phase("plan", "reusing blocks/*.json of this run id");
                        b
                    }
                    None => plan_rules(
                        &ctx,
                        ctx.runtime_notes
                            .as_ref()
                            .unwrap_or(&RuntimeNotes::assumed_debian()),
                    )?,
                };
                let cp_t0 = Instant::now();
                let cp = self.commit("workspace", 0, "success", Some(base)).await?;
                self.after_checkpoint(cp_t0.elapsed());
                (blocks, 0, Some(cp.image_ref))
            }
        };
        self.obs.event(&BuildEvent::Plan {
            blocks: blocks
                .iter()
                .map(|b| (b.id.clone(), b.title.clone()))
                .collect(),
        });
        self.save_blocks(&blocks)?;
        self.manifest.blocks = blocks.clone();
        self.save()?;

        let total = blocks.len();
        for i in start_index..total {
            let t0 = Instant::now();
            if self.container.is_none() {
                let image = current
                    .clone()
                    .ok_or_else(|| EnvError::Usage("no checkpoint to continue from".into()))?;
                self.start_container(&image).await?;
            }
            blocks[i].status = BlockStatus::Running;
            blocks[i].baseline_checkpoint = current.clone();
            self.manifest.blocks = blocks.clone();
            self.save()?;
            self.obs.event(&BuildEvent::BlockStarted {
                id: blocks[i].id.clone(),
                title: blocks[i].title.clone(),
                index: i,
                total,
            });
            let (step, timing) = self.run_block(&blocks[i], current.clone()).await?;
            match step {
                Step::Failed(err) => {
                    blocks[i].status = BlockStatus::Failed;
                    blocks[i].last_error = Some(err.clone());
                    blocks[i].timing = Some(timing);
                    self.manifest.blocks = blocks.clone();
                    self.save_blocks(&blocks[i..=i])?;
                    self.obs.event(&BuildEvent::BlockFinished {
                        id: blocks[i].id.clone(),
                        ok: false,
                        duration: t0.elapsed(),
                        detail: err.clone(),
                    });
                    self.manifest.error = Some(format!("block {} failed: {err}", blocks[i].id));
                    return Ok(());
                }
                Step::Ok => {
                    let cp_t0 = Instant::now();
                    let cp = self
                        .commit(&blocks[i].id, i as u32 + 1, "success", current.clone())
                        .await?;
                    self.after_checkpoint(cp_t0.elapsed());
                    let mut timing = timing;
                    timing.checkpoint_s = round3(cp_t0.elapsed().as_secs_f64());
                    timing.total_s = round3(t0.elapsed().as_secs_f64());
                    if let Some(last) = self.manifest.executions.last_mut() {
                        last.checkpoint_after = Some(cp.image_ref.clone());
                    }
                    blocks[i].status = BlockStatus::Succeeded;
                    blocks[i].success_checkpoint = Some(cp.image_ref.clone());
                    blocks[i].timing = Some(timing);
                    current = Some(cp.image_ref);
                    self.manifest.blocks = blocks.clone();
                    self.save_blocks(&blocks[i..=i])?;
                    self.save()?;
                    self.obs.event(&BuildEvent::BlockFinished {
                        id: blocks[i].id.clone(),
                        ok: true,
                        duration: t0.elapsed(),
                        detail: String::new(),
                    });
                }
            }
        }
        self.finalize(&blocks, current).await
    }

    /// Decide whether the next block continues in this container.
    ///
    /// `docker commit` archives the container's whole writable layer, i.e.
    /// everything since the container started. While that layer is small (the
    /// last commit was cheaper than starting a container), the next block
    /// continues here; once it is large, the next block starts in a fresh
    /// container from the checkpoint just made (as `docker build` runs each
    /// step), so commits stay proportional to one block's own changes. The
    /// retired container is removed in the background.
    fn after_checkpoint(&mut self, commit_took: Duration) {
        tracing::debug!(
            commit_ms = commit_took.as_millis() as u64,
            keep = commit_took <= KEEP_CONTAINER_BELOW,
            "checkpoint committed"
        );
        if commit_took > KEEP_CONTAINER_BELOW {
            if let Some(c) = self.container.take() {
                self.retired.push(c);
            }
        }
    }

    async fn preflight(&mut self) -> Result<RuntimeNotes, EnvError> {
        self.phase("preflight", "reading facts from the image");
        let out = self
            .exec(
                "container_preflight",
                "container_preflight",
                1,
                vec!["/bin/sh".into(), "-c".into(), preflight::script()],
                "container preflight",
                Duration::from_secs(120),
                None,
            )
            .await?;
        let log = std::fs::read_to_string(self.dir.log_path(
            "container_preflight",
            "container_preflight",
            1,
        ))
        .unwrap_or_default();
        if !out.success() {
            return Err(EnvError::Plan(format!(
                "the container preflight failed (exit {}); does the image have /bin/sh? Log: {}",
                out.exit_code,
                self.dir
                    .log_path("container_preflight", "container_preflight", 1)
                    .display()
            )));
        }
        Ok(RuntimeNotes::parse(&log))
    }

    /// Run one block and its validation. Checkpointing is the caller's.
    async fn run_block(
        &mut self,
        block: &Block,
        checkpoint: Option<String>,
    ) -> Result<(Step, BlockTiming), EnvError> {
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
        let mut timing = BlockTiming::default();
        let out = self
            .exec(
                &block.id,
                "block",
                1,
                vec!["bash".into(), path.clone()],
                &format!("bash {path}"),
                self.opts.command_timeout,
                checkpoint.clone(),
            )
            .await?;
        timing.script_s = round3(out.duration.as_secs_f64());
        if !out.success() {
            return Ok((
                Step::Failed(summarize_failure(
                    "the block script",
                    &out,
                    self.opts.command_timeout,
                )),
                timing,
            ));
        }
        let out = self
            .exec(
                &block.id,
                "validation",
                1,
                vec!["bash".into(), "-c".into(), block.validation_command.clone()],
                &block.validation_command,
                self.opts.command_timeout,
                checkpoint,
            )
            .await?;
        timing.validation_s = round3(out.duration.as_secs_f64());
        if !out.success() {
            return Ok((
                Step::Failed(summarize_failure(
                    &format!("validation `{}`", block.validation_command),
                    &out,
                    self.opts.command_timeout,
                )),
                timing,
            ));
        }
        Ok((Step::Ok, timing))
    }

    async fn finalize(
        &mut self,
        blocks: &[Block],
        current: Option<String>,
    ) -> Result<(), EnvError> {
        let Some(last) = current else {
            self.manifest.error = Some("no checkpoint was made".into());
            return Ok(());
        };
        let t0 = Instant::now();
        let final_ref = format!("{}:{}-final", self.opts.image_prefix, self.dir.run_id);
        self.rt.tag_image(&last, &final_ref).await?;
        self.record(Execution {
            block_id: "finalize".into(),
            phase: "finalize".into(),
            attempt: 1,
            exit_code: Some(0),
            timed_out: false,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            checkpoint_before: Some(last.clone()),
            checkpoint_after: Some(final_ref.clone()),
            repair_command: None,
            duration_s: round3(t0.elapsed().as_secs_f64()),
            command: format!("docker tag {last} {final_ref}"),
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
            let log_path = self.dir.log_path("oracle", &format!("oracle-{}", i + 1), 1);
            let exec = ExecSpec {
                argv: vec!["bash".into(), "-c".into(), c.command.clone()],
                working_dir: Some(REPO_DIR.to_string()),
                env: vec![],
                timeout: Some(self.opts.oracle_timeout),
                log_path: log_path.clone(),
            };
            let res = self
                .rt
                .exec(&cid, &exec, &self.redactor, &NoopObserver)
                .await;
            let _ = self.rt.remove(&cid).await;
            let out = res?;
            self.record(Execution {
                block_id: c.oracle_id.clone(),
                phase: "oracle".into(),
                attempt: 1,
                exit_code: Some(out.exit_code),
                timed_out: out.timed_out,
                stdout_tail: out.stdout_tail.clone(),
                stderr_tail: out.stderr_tail.clone(),
                checkpoint_before: Some(image.to_string()),
                checkpoint_after: None,
                repair_command: None,
                duration_s: round3(out.duration.as_secs_f64()),
                command: c.command.clone(),
                log_path: Some(log_path.clone()),
                started_at: belay_record::now_rfc3339(),
            })?;
            results.push(OracleCommandResult {
                oracle_id: c.oracle_id.clone(),
                command: c.command.clone(),
                exit_code: Some(out.exit_code),
                timed_out: out.timed_out,
                ok: out.success(),
                duration_s: round3(out.duration.as_secs_f64()),
                log_path,
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
        write_redacted_json(
            &self.dir.llm_usage(),
            &self.manifest.llm_usage,
            &self.redactor,
        )?;
        self.save()?;
        self.obs.event(&BuildEvent::Finished {
            ok: self.manifest.ok,
            final_image: self.manifest.final_image.clone(),
            error: self.manifest.error.clone(),
            duration: self.started.elapsed(),
        });
        result
    }
}

fn read_context(dir: &RunDir) -> Option<RepoContext> {
    let t = std::fs::read_to_string(dir.context()).ok()?;
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

fn summarize_failure(what: &str, out: &ExecOutcome, timeout: Duration) -> String {
    if out.timed_out {
        return format!(
            "{what} exceeded --command-timeout ({} s) and was killed",
            timeout.as_secs()
        );
    }
    let line = last_line(&out.stderr_tail)
        .or_else(|| last_line(&out.stdout_tail))
        .unwrap_or_default();
    format!("{what} exited with {}: {line}", out.exit_code)
}

fn last_line(s: &str) -> Option<String> {
    s.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(300).collect())
}

fn write_redacted_json<T: serde::Serialize>(
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

fn round3(x: f64) -> f64 {
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
        assert_eq!(parse_checkpoint_tag("r-final"), None);
        assert_eq!(parse_checkpoint_tag("latest"), None);
    }
}
