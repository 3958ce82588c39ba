//! The first phase of a build: resume or start fresh.
//!
//! A resume (`--resume-from`, or the newest checkpoint of this run id that
//! still exists) starts a container of its checkpoint, reuses the run's
//! blocks (or plans for the base image the checkpoint grew from), and finds
//! the first block to run; a toolchain checkpoint gets the repository copied
//! onto it. A fresh start resolves the base image, reads its runtime notes
//! (the preflight) and plans; its toolchain and workspace are laid in the
//! next phase (`toolchain.rs`). Either way the plan is then recorded.

use super::*;
use crate::manifest::ToolchainLayers;

/// Where the block loop starts: the plan, the first block to run, and the
/// checkpoint it runs on (`None` on a fresh start, until the toolchain phase
/// lays the workspace).
pub(super) struct Start {
    pub(super) blocks: Vec<Block>,
    pub(super) index: usize,
    pub(super) image: Option<String>,
}

impl Run<'_> {
    /// Phase 1: resume from a checkpoint, or start fresh from the base image;
    /// the plan decided and recorded.
    pub(super) async fn resume_or_fresh(
        &mut self,
        mut ctx: RepoContext,
        prev_blocks: Option<Vec<Block>>,
    ) -> Result<Start, EnvError> {
        self.prepare_host(&ctx)?;
        let resume = self
            .store
            .resume_point(
                self.opts.resume_from.as_deref(),
                &self.manifest.checkpoints,
                prev_blocks.is_some(),
            )
            .await?;
        self.obs.event(&BuildEvent::RunStarted {
            run_id: self.dir.run_id.clone(),
            run_dir: self.dir.root.display().to_string(),
            resumed_from: resume.as_ref().map(|r| r.0.clone()),
        });
        let start = match resume {
            Some((image, done_block)) => {
                self.resume(&mut ctx, image, done_block, prev_blocks)
                    .await?
            }
            None => self.fresh(&mut ctx, prev_blocks).await?,
        };
        self.ctx = ctx;
        self.record_plan(&start.blocks)?;
        Ok(start)
    }

    /// What every container of the run sees of the host: the CA bundle, the
    /// paths not copied in, and the environment's fingerprint (for keys).
    fn prepare_host(&mut self, ctx: &RepoContext) -> Result<(), EnvError> {
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
        self.excluded = excluded_paths(ctx, state_rel.as_deref());
        self.env_fingerprint = cache::env_fingerprint(
            &self.container_env(),
            &self.trust.container_files(),
            self.opts.network.as_docker(),
        );
        Ok(())
    }

    /// Resume from `image`, which completed `done_block`: a container of it,
    /// the plan, the first block to run, and the chain under the copy.
    async fn resume(
        &mut self,
        ctx: &mut RepoContext,
        image: String,
        done_block: Option<String>,
        prev_blocks: Option<Vec<Block>>,
    ) -> Result<Start, EnvError> {
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
        let notes = self.resume_notes(ctx, &image).await?;
        // The preflight may have used a container of the base image.
        self.pool.retire();
        self.start_container(&image).await?;
        // The same run id reuses its blocks; another run's checkpoint gets
        // the plan for its base image.
        let mut blocks = match prev_blocks {
            Some(b) => b,
            None => self.plan_blocks(ctx, &notes).await?,
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
        self.laid_under = self.store.under_workspace_of(&image).await?;
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
        let image = if self.store.is_toolchain(&image).await? {
            self.laid_under = start;
            self.lay_workspace(&image, &blocks[..start]).await?
        } else {
            image
        };
        self.record_chain(&mut blocks);
        Ok(Start {
            blocks,
            index: start,
            image: Some(image),
        })
    }

    /// The runtime notes a resume plans with: this run's, else those of the
    /// base image the checkpoint `image` grew from (of the checkpoint when
    /// the base is gone), kept in `context.json`.
    async fn resume_notes(
        &mut self,
        ctx: &mut RepoContext,
        image: &str,
    ) -> Result<RuntimeNotes, EnvError> {
        if let Some(n) = read_context(&self.dir).and_then(|c| c.runtime_notes) {
            return Ok(n);
        }
        // Plan for the base image the checkpoint grew from, not for
        // the checkpoint: the final scripts must rebuild from the base.
        let base = self
            .manifest
            .base_image
            .clone()
            .unwrap_or_else(|| image.to_string());
        let n = match self.store.image_id(&base).await {
            Ok(base_id) => self.runtime_notes(&base_id, &base).await?,
            Err(_) => {
                self.phase(
                    "warning",
                    format!("the base image {base} is gone: planning from the checkpoint instead"),
                );
                let id = self.store.image_id(image).await?;
                self.runtime_notes(&id, image).await?
            }
        };
        ctx.runtime_notes = Some(n.clone());
        write_redacted_json(&self.dir.context(), &*ctx, &self.redactor)?;
        Ok(n)
    }

    /// The flags and the record say what this run's chain is: which blocks
    /// are under the repository copy.
    fn record_chain(&mut self, blocks: &mut [Block]) {
        let under = self.laid_under.min(blocks.len());
        for (i, b) in blocks.iter_mut().enumerate() {
            b.before_workspace = i < under;
        }
        self.manifest.toolchain = (under > 0).then(|| ToolchainLayers {
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
    }

    /// A fresh start: the base image (shared through the registry), its
    /// runtime notes, and the plan (this run id's blocks, or a new one).
    async fn fresh(
        &mut self,
        ctx: &mut RepoContext,
        prev_blocks: Option<Vec<Block>>,
    ) -> Result<Start, EnvError> {
        let base = self.resolve_base().await?;
        self.store.share_base(&base).await?;
        self.manifest.base_image = Some(base.clone());
        let base_id = self.store.image_id(&base).await?;
        // Of the base (the notes are keyed by its id), from a container
        // of it when no earlier run on this machine read them.
        if ctx.runtime_notes.is_none() {
            ctx.runtime_notes = Some(self.runtime_notes(&base_id, &base).await?);
        }
        write_redacted_json(&self.dir.context(), &*ctx, &self.redactor)?;
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
                self.plan_blocks(ctx, &notes).await?
            }
        };
        // The toolchain and the workspace are laid once the plan is saved.
        Ok(Start {
            blocks,
            index: 0,
            image: None,
        })
    }

    /// The plan decided: announced, each block's file and script written,
    /// and the manifest saved.
    fn record_plan(&mut self, blocks: &[Block]) -> Result<(), EnvError> {
        self.obs.event(&BuildEvent::Plan {
            blocks: blocks
                .iter()
                .map(|b| (b.id.clone(), b.title.clone()))
                .collect(),
        });
        for b in blocks {
            self.records.save_block_and_script(b)?;
        }
        self.manifest.blocks = blocks.to_vec();
        self.save()
    }

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
            // host-owned: belay's preflight cache under its state dir.
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
        // host-owned: the log belay wrote of the probe's output.
        let text = fs_err::read_to_string(&log).unwrap_or_default();
        Ok(RuntimeNotes::parse(&text))
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
        let Ok(base_id) = self.store.image_id(&base).await else {
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
    // host-owned: belay's own analysis record in the run dir.
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
