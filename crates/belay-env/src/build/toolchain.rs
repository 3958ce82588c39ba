//! The toolchain under the workspace. The plan's leading blocks that read
//! nothing of the repository (the preflight, the system packages, the
//! language runtimes: `Block::before_workspace`) run before the repository is
//! copied in, and the workspace checkpoint sits on the last of them. Their
//! checkpoints are keyed by the base image, the script and the container
//! environment alone, so that every project on the same base shares them: a
//! batch installs each distinct toolchain once.
//!
//! That holds under `--no-cache` too, within one scope (the batch, or the
//! run): as one BuildKit build merges identical steps, the checkpoints this
//! batch made are reused, and nothing made before it. Two builds of one
//! process that need the same toolchain block wait for each other instead of
//! both running it.
//!
//! A toolchain block that fails runs again after the copy, where repair and
//! rollback work as for any block; a rollback that patches one of them moves
//! it, and the blocks after it, above the copy.

use std::cmp::Reverse;
use std::sync::{Arc, Mutex, OnceLock};

use super::*;
use crate::manifest::ToolchainLayers;

/// The `belay.kind` of toolchain checkpoints.
pub const TOOLCHAIN_KIND: &str = "toolchain";

/// One lock per toolchain key in this process: the first build makes the
/// checkpoint, the others then find it.
fn flight(key: &str) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    locks.entry(key.to_string()).or_default().clone()
}

/// How many leading blocks may run before the copy, in a build of
/// `ablation` with these excluded paths. A build that shares checkpoints
/// through a registry (`registry`) keeps every block above the copy: the
/// toolchain images are this engine's own, and a workspace on one would never
/// match another machine's key.
pub(crate) fn toolchain_len(
    blocks: &[Block],
    ablation: Ablation,
    excluded: &[String],
    registry: bool,
) -> usize {
    if registry {
        return 0;
    }
    // The command and whole-script modes measure their own forms of forward
    // and recovery on the plan as written.
    if ablation.forward() != Granularity::Block || ablation.recovery() != Granularity::Block {
        return 0;
    }
    // A host `.venv` is kept out of the copy, and the written Dockerfile
    // removes it after its COPY: that would remove the runtime block's venv.
    if excluded.iter().any(|e| e == ".venv") {
        return 0;
    }
    blocks.iter().take_while(|b| b.before_workspace).count()
}

impl Run<'_> {
    fn scope(&self) -> String {
        self.opts
            .cache_scope
            .clone()
            .unwrap_or_else(|| self.dir.run_id.clone())
    }

    /// Lay the toolchain blocks, then the workspace on top of them. Returns
    /// how many blocks are under the copy and the workspace checkpoint.
    pub(super) async fn lay(&mut self, blocks: &mut [Block]) -> Result<(usize, String), EnvError> {
        let base = self.manifest.base_image.clone().ok_or_else(|| {
            EnvError::Usage("laying the workspace needs the run's base image".into())
        })?;
        // The preflight's container is of the base, without the trust files.
        self.retire_container();
        let n = toolchain_len(
            blocks,
            self.opts.ablation,
            &self.excluded,
            self.registry.is_some(),
        );
        // Recorded before any of them runs: the manifest of a build killed
        // meanwhile says which checkpoints lack the repository.
        self.manifest.toolchain = (n > 0).then(|| ToolchainLayers {
            blocks: blocks[..n].iter().map(|b| b.id.clone()).collect(),
            ..Default::default()
        });
        self.save()?;
        let (under, n) = match n {
            0 => (base.clone(), 0),
            n => match self.lay_toolchain(blocks, n, &base).await? {
                Some(top) => (top, n),
                None => {
                    crate::manifest::retire_checkpoints(&mut self.manifest.checkpoints, 1);
                    self.checkpoint_log.append(
                        &crate::manifest::CheckpointRecord::Retired { retired_from: 1 },
                        &self.redactor,
                    )?;
                    (base.clone(), 0)
                }
            },
        };
        self.laid_under = n;
        // The flags now say what this run does: the written Dockerfile and a
        // resume read them.
        for (i, b) in blocks.iter_mut().enumerate() {
            if b.before_workspace != (i < n) {
                b.before_workspace = i < n;
                self.save_block(b)?;
            }
        }
        self.manifest.toolchain = (n > 0).then(|| ToolchainLayers {
            blocks: blocks[..n].iter().map(|b| b.id.clone()).collect(),
            shared: blocks[..n]
                .iter()
                .filter(|b| b.cached)
                .filter(|b| {
                    !b.success_checkpoint
                        .as_ref()
                        .and_then(|c| self.image_ids.get(c))
                        .is_some_and(|id| self.made_toolchain.contains(id))
                })
                .map(|b| b.id.clone())
                .collect(),
            image: under.clone(),
        });
        let ws = self.lay_workspace(&under, &blocks[..n]).await?;
        Ok((n, ws))
    }

    /// Run (or find) `blocks[..n]` from `base`. `None` when one failed: every
    /// block then runs after the copy.
    async fn lay_toolchain(
        &mut self,
        blocks: &mut [Block],
        n: usize,
        base: &str,
    ) -> Result<Option<String>, EnvError> {
        let mut current = base.to_string();
        for i in 0..n {
            let t0 = Instant::now();
            blocks[i].baseline_checkpoint = Some(current.clone());
            let key = self.block_key(&blocks[i], &current).await?;
            let lock = flight(&key);
            let _held = lock.lock().await;
            if let Some(image) = self.toolchain_lookup(&key, &blocks[i].id).await? {
                if self.opts.cache && !self.made_toolchain.contains(&image) {
                    self.manifest.cache.hits += 1;
                }
                self.retire_container();
                let b = &mut blocks[i];
                b.status = BlockStatus::Succeeded;
                b.cached = true;
                b.last_error = None;
                b.timing = Some(BlockTiming {
                    total_s: round3(t0.elapsed().as_secs_f64()),
                    ..Default::default()
                });
                let from = self.toolchain_tag(&blocks[i].id, &key);
                let cp = self
                    .record_toolchain(i, &blocks[i].id, &image, &current, Some(from))
                    .await?;
                let detail = format!("shared toolchain {}", cp.cached_from.unwrap_or_default());
                current = self.block_done(blocks, i, cp.image_ref, true, t0, detail)?;
                continue;
            }
            if self.opts.cache {
                self.manifest.cache.misses += 1;
            }
            if self.container.is_none() {
                self.start_base_container(&current).await?;
            }
            self.block_started(blocks, i)?;
            let (step, mut timing) = self.forward_block(&blocks[i].clone()).await?;
            if let Err(f) = step {
                self.retire_container();
                self.phase(
                    "toolchain",
                    format!(
                        "{} failed before the repository copy ({}); the plan runs after the copy instead, where repair can fix it",
                        blocks[i].id, f.summary
                    ),
                );
                for b in blocks.iter_mut().take(i + 1) {
                    b.status = BlockStatus::Planned;
                    b.cached = false;
                    b.success_checkpoint = None;
                    b.baseline_checkpoint = None;
                }
                return Ok(None);
            }
            let cp_t0 = Instant::now();
            let image = self.commit_toolchain(&blocks[i].id, &key, base).await?;
            let cp = self
                .record_toolchain(i, &blocks[i].id, &image, &current, None)
                .await?;
            self.after_checkpoint(cp_t0.elapsed(), &cp.image_ref).await;
            timing.checkpoint_s = round3(cp_t0.elapsed().as_secs_f64());
            timing.total_s = round3(t0.elapsed().as_secs_f64());
            let b = &mut blocks[i];
            b.status = BlockStatus::Succeeded;
            b.last_error = None;
            b.timing = Some(timing);
            current = self.block_done(blocks, i, cp.image_ref, false, t0, String::new())?;
        }
        Ok(Some(current))
    }

    /// The toolchain checkpoint as this run's checkpoint of block `i`: its
    /// run tag on the shared image, and its record.
    async fn record_toolchain(
        &mut self,
        i: usize,
        block: &str,
        image_id: &str,
        parent: &str,
        shared_from: Option<String>,
    ) -> Result<Checkpoint, EnvError> {
        let seq = i as u32 + 1;
        let image_ref = checkpoint_ref(
            &self.opts.image_prefix,
            &self.dir.run_id,
            seq,
            block,
            "success",
        );
        self.rt.tag_image(image_id, &image_ref).await?;
        self.image_ids
            .insert(image_ref.clone(), image_id.to_string());
        let cp = Checkpoint {
            id: format!("{seq:03}-{block}"),
            image_ref,
            block_id: block.to_string(),
            parent_image_ref: Some(parent.to_string()),
            kind: "success".into(),
            image_id: image_id.to_string(),
            created_at: belay_record::now_rfc3339(),
            cached_from: shared_from,
        };
        self.push_checkpoint(cp.clone());
        Ok(cp)
    }

    /// The shared name of the toolchain checkpoint of `block` under `key`:
    /// one repository for every project (a batch's image prefixes are per
    /// project), in the registry of the prefix when it has one.
    fn toolchain_tag(&self, block: &str, key: &str) -> String {
        let repo = match self.opts.image_prefix.rsplit_once('/') {
            Some((registry, _)) => format!("{registry}/belay-toolchain"),
            None => "belay-toolchain".to_string(),
        };
        format!("{repo}:{block}-{}", &key[..key.len().min(24)])
    }

    /// The newest toolchain checkpoint of `block` under `key` on this engine:
    /// any, with the cache on; else one made in this scope.
    async fn toolchain_lookup(
        &mut self,
        key: &str,
        block: &str,
    ) -> Result<Option<String>, EnvError> {
        let mut filters = vec![format!("{}={key}", cache::KEY_LABEL)];
        if !self.opts.cache {
            filters.push(format!("{}={}", cache::SCOPE_LABEL, self.scope()));
        }
        let mut found: Vec<_> = self
            .rt
            .list_images(&filters)
            .await?
            .into_iter()
            .filter(|i| {
                i.labels.get(labels::BLOCK).map(String::as_str) == Some(block)
                    && i.labels.get(labels::KIND).map(String::as_str) == Some(TOOLCHAIN_KIND)
            })
            .collect();
        found.sort_by_key(|i| Reverse(i.created));
        let Some(img) = found.into_iter().next() else {
            return Ok(None);
        };
        // By id: a tag may move to another build's image of the same key.
        Ok(Some(img.id))
    }

    /// Commit the container as the toolchain checkpoint of `block` under `key`.
    async fn commit_toolchain(
        &mut self,
        block: &str,
        key: &str,
        base: &str,
    ) -> Result<String, EnvError> {
        let container = self
            .container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))?;
        let image_ref = self.toolchain_tag(block, key);
        let lbl: BTreeMap<String, String> = [
            (cache::KEY_LABEL, key.to_string()),
            (cache::ALT_LABEL, String::new()),
            (cache::SCRIPT_LABEL, String::new()),
            (cache::SCOPE_LABEL, self.scope()),
            (cache::UNDER_WORKSPACE_LABEL, String::new()),
            (labels::RUN, String::new()),
            (labels::KIND, TOOLCHAIN_KIND.to_string()),
            (labels::BLOCK, block.to_string()),
            (CHECKPOINT_KIND_LABEL, "success".to_string()),
            (BASE_LABEL, base.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let id = self.rt.commit(&container, &image_ref, &lbl).await?;
        self.made_toolchain.insert(id.clone());
        Ok(id)
    }

    /// The workspace checkpoint: the repository copied onto `under`, or the
    /// same copy made before (with the cache on).
    pub(super) async fn lay_workspace(
        &mut self,
        under: &str,
        below: &[Block],
    ) -> Result<String, EnvError> {
        let under_id = self.image_id(under).await?;
        let (repo, excluded) = (self.repo.clone(), self.excluded.clone());
        let tree = tokio::task::spawn_blocking(move || cache::tree_hash(&repo, &excluded))
            .await
            .map_err(|e| EnvError::Usage(format!("hashing the repository failed: {e}")))??;
        let key = cache::workspace_key(&under_id, &tree, &self.env_fingerprint);
        if self.opts.cache {
            if let Some(hit) = self.cache_lookup(&key, "workspace").await? {
                // The next block starts from the adopted image, not from
                // whatever container is running.
                self.retire_container();
                self.phase("cache", "workspace checkpoint reused");
                let cp = self
                    .adopt_cached(hit, "workspace", 0, Some(under.to_string()))
                    .await?;
                return Ok(cp.image_ref);
            }
            self.manifest.cache.misses += 1;
        }
        self.phase("copy", format!("{} -> {REPO_DIR}", self.repo.display()));
        self.start_workspace_container(under).await?;
        let ids: Vec<&str> = below.iter().map(|b| b.id.as_str()).collect();
        let extra = BTreeMap::from([
            (cache::KEY_LABEL.to_string(), key),
            (cache::UNDER_WORKSPACE_LABEL.to_string(), ids.join(",")),
        ]);
        let cp_t0 = Instant::now();
        let cp = self
            .commit("workspace", 0, "success", Some(under.to_string()), extra)
            .await?;
        self.after_checkpoint(cp_t0.elapsed(), &cp.image_ref).await;
        Ok(cp.image_ref)
    }

    /// Where the clean replay may start: the checkpoint of the last toolchain
    /// block, when every block under the copy ran unrepaired. A toolchain
    /// checkpoint is itself a clean run of the same scripts from the base
    /// (found by the key of exactly that), so replaying them proves nothing more.
    pub(super) fn replay_start(&self, blocks: &[Block]) -> Option<(usize, String)> {
        let n = self.laid_under.min(blocks.len());
        if n == 0 || self.opts.force_clean_replay {
            return None;
        }
        let clean = blocks[..n]
            .iter()
            .all(|b| b.status == BlockStatus::Succeeded && b.repair_attempts == 0);
        let top = blocks[n - 1].success_checkpoint.clone()?;
        clean.then_some((n, top))
    }

    /// Whether `image` is a toolchain checkpoint (no repository in it).
    pub(super) async fn is_toolchain(&mut self, image: &str) -> Result<bool, EnvError> {
        Ok(self.rt.image(image).await?.is_some_and(|i| {
            i.labels.get(labels::KIND).map(String::as_str) == Some(TOOLCHAIN_KIND)
        }))
    }

    /// How many blocks are under the copy in `image` (a checkpoint of a run).
    pub(super) async fn under_workspace_of(&mut self, image: &str) -> Result<usize, EnvError> {
        Ok(self
            .rt
            .image(image)
            .await?
            .and_then(|i| i.labels.get(cache::UNDER_WORKSPACE_LABEL).cloned())
            .map(|s| s.split(',').filter(|b| !b.is_empty()).count())
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(flags: &[bool]) -> Vec<Block> {
        flags
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let mut b =
                    Block::planned(&format!("{i:02}-b"), "B", "g", &["true".into()], "true");
                b.before_workspace = *f;
                b
            })
            .collect()
    }

    #[test]
    fn only_the_leading_repo_free_blocks_go_under_the_copy() {
        let blocks = plan(&[true, true, false, true]);
        assert_eq!(toolchain_len(&blocks, Ablation::Full, &[], false), 2);
        assert_eq!(
            toolchain_len(&plan(&[false, true]), Ablation::Full, &[], false),
            0
        );
        assert_eq!(
            toolchain_len(&blocks, Ablation::WithoutFinalCleanReplay, &[], false),
            2
        );
    }

    #[test]
    fn no_toolchain_in_the_command_and_whole_script_modes_or_over_a_host_venv() {
        let blocks = plan(&[true, true, false]);
        for a in [
            Ablation::SingleCommandForward,
            Ablation::SingleCommandRecovery,
            Ablation::WholeScriptForward,
            Ablation::WholeScriptRecovery,
        ] {
            assert_eq!(toolchain_len(&blocks, a, &[], false), 0, "{a:?}");
        }
        assert_eq!(
            toolchain_len(&blocks, Ablation::Full, &[".venv".to_string()], false),
            0
        );
        assert_eq!(
            toolchain_len(
                &blocks,
                Ablation::Full,
                &["node_modules".to_string()],
                false
            ),
            2
        );
        // Through a registry, every block stays above the copy.
        assert_eq!(toolchain_len(&blocks, Ablation::Full, &[], true), 0);
    }
}
