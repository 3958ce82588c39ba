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
//!
//! This is the second phase of a build ([`Run::toolchain`]); the checkpoint
//! store names, commits and finds the toolchain images (`checkpoints.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::start::Start;
use super::*;
use crate::manifest::ToolchainLayers;

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
    /// Phase 2: the toolchain. A fresh start lays the toolchain blocks and
    /// the workspace on top of them; a resume is on its chain already (its
    /// start copied the repository onto a toolchain checkpoint). Returns the
    /// first block to run and the checkpoint it runs on.
    pub(super) async fn toolchain(
        &mut self,
        start: &mut Start,
    ) -> Result<(usize, String), EnvError> {
        match start.image.take() {
            Some(image) => Ok((start.index, image)),
            None => self.lay(&mut start.blocks).await,
        }
    }

    /// The scope toolchain checkpoints are shared in under `--no-cache`.
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
        self.pool.retire();
        let n = toolchain_len(
            blocks,
            self.opts.ablation,
            &self.excluded,
            self.store.has_registry(),
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
                    self.retire_checkpoints(1)?;
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
                self.records.save_block(b)?;
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
                        .is_some_and(|c| self.store.made_here(c))
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
                if self.opts.cache && !self.store.made_toolchain(&image) {
                    self.manifest.cache.hits += 1;
                }
                self.pool.retire();
                let b = &mut blocks[i];
                b.status = BlockStatus::Succeeded;
                b.cached = true;
                b.last_error = None;
                b.timing = Some(BlockTiming {
                    total_s: round3(t0.elapsed().as_secs_f64()),
                    ..Default::default()
                });
                let cp = self
                    .record_toolchain(i, &blocks[i].id, &image, &current, Some(&key))
                    .await?;
                let detail = format!("shared toolchain {}", cp.cached_from.unwrap_or_default());
                current = self.block_done(blocks, i, cp.image_ref, true, t0, detail)?;
                continue;
            }
            if self.opts.cache {
                self.manifest.cache.misses += 1;
            }
            if self.pool.id().is_none() {
                self.start_base_container(&current).await?;
            }
            self.block_started(blocks, i)?;
            let (step, mut timing) = self.forward_block(&blocks[i].clone()).await?;
            if let Err(f) = step {
                self.pool.retire();
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
            self.pool
                .after_checkpoint(cp_t0.elapsed(), &cp.image_ref)
                .await;
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
    /// run tag on the shared image, and its record (a shared one found under
    /// `shared_key`).
    async fn record_toolchain(
        &mut self,
        i: usize,
        block: &str,
        image_id: &str,
        parent: &str,
        shared_key: Option<&str>,
    ) -> Result<Checkpoint, EnvError> {
        let cp = self
            .store
            .tag_toolchain(i as u32 + 1, block, image_id, parent, shared_key)
            .await?;
        self.push_checkpoint(cp.clone());
        Ok(cp)
    }

    /// The newest toolchain checkpoint of `block` under `key` on this engine:
    /// any, with the cache on; else one made in this scope.
    async fn toolchain_lookup(
        &mut self,
        key: &str,
        block: &str,
    ) -> Result<Option<String>, EnvError> {
        let scope = (!self.opts.cache).then(|| self.scope());
        self.store.toolchain_lookup(key, block, scope).await
    }

    /// Commit the container as the toolchain checkpoint of `block` under `key`.
    async fn commit_toolchain(
        &mut self,
        block: &str,
        key: &str,
        base: &str,
    ) -> Result<String, EnvError> {
        let container = self.pool.require()?;
        let scope = self.scope();
        self.store
            .commit_toolchain(&container, block, key, base, scope)
            .await
    }

    /// The workspace checkpoint: the repository copied onto `under`, or the
    /// same copy made before (with the cache on).
    pub(super) async fn lay_workspace(
        &mut self,
        under: &str,
        below: &[Block],
    ) -> Result<String, EnvError> {
        let under_id = self.store.image_id(under).await?;
        let (repo, excluded) = (self.repo.clone(), self.excluded.clone());
        let tree = tokio::task::spawn_blocking(move || cache::tree_hash(&repo, &excluded))
            .await
            .map_err(|e| EnvError::Usage(format!("hashing the repository failed: {e}")))??;
        let key = cache::workspace_key(&under_id, &tree, &self.env_fingerprint);
        if self.opts.cache {
            if let Some(hit) = self.store.lookup(&key, "workspace").await? {
                // The next block starts from the adopted image, not from
                // whatever container is running.
                self.pool.retire();
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
        self.pool
            .after_checkpoint(cp_t0.elapsed(), &cp.image_ref)
            .await;
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
