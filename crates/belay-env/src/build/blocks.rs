//! The third phase of a build: the blocks, in order from where the start
//! left off. Each block is a cache hit (an earlier checkpoint of the same
//! parent, script and environment, adopted without running), or runs with its
//! validation and is committed as a checkpoint; a block that fails is
//! repaired ([`super::recover`]), which may roll the build back to an earlier
//! block. The `whole-script-forward` ablation runs every block as one script
//! first.

use super::*;
use recover::Recovery;

/// Where the block loop is: the block to run next, the checkpoint it runs
/// on, and the rollbacks made so far (each `(failed, patched)` pair once).
struct Cursor {
    i: usize,
    current: String,
    rollbacks: Vec<(usize, usize)>,
}

impl Run<'_> {
    /// Phase 3: the blocks from `start` on, the first on `current`. Returns
    /// the checkpoint to finalize, or `None` when a block failed (the
    /// manifest says which, and why).
    pub(super) async fn run_blocks(
        &mut self,
        blocks: &mut [Block],
        start: usize,
        current: String,
    ) -> Result<Option<String>, EnvError> {
        if self.opts.ablation.forward() == Granularity::WholeScript && start == 0 {
            if let Some(cp) = self.whole_script_forward(blocks, &current).await? {
                return Ok(Some(cp));
            }
            // The whole script failed: fall back to block-level forward with recovery.
            self.pool.retire();
        }
        self.pool.set_checkpoint(current.clone());
        let mut cur = Cursor {
            i: start,
            current,
            rollbacks: Vec::new(),
        };
        while cur.i < blocks.len() {
            if !self.step(blocks, &mut cur).await? {
                return Ok(None);
            }
        }
        Ok(Some(cur.current))
    }

    /// Block `cur.i`: adopted from the cache, or run and committed, or
    /// recovered. `false` when it failed for good.
    async fn step(&mut self, blocks: &mut [Block], cur: &mut Cursor) -> Result<bool, EnvError> {
        let (i, t0) = (cur.i, Instant::now());
        blocks[i].baseline_checkpoint = Some(cur.current.clone());
        let key = self.block_key(&blocks[i], &cur.current).await?;
        if self.opts.cache {
            if let Some(hit) = self.store.lookup(&key, &blocks[i].id.clone()).await? {
                cur.current = self.adopt_block(blocks, i, hit, &cur.current, t0).await?;
                cur.i += 1;
                return Ok(true);
            }
            self.manifest.cache.misses += 1;
        }
        self.ensure_container(&cur.current).await?;
        self.block_started(blocks, i)?;
        let (step, timing) = self.forward_block(&blocks[i].clone()).await?;
        match step {
            Ok(()) => {
                cur.current = self
                    .commit_block(blocks, i, key, &cur.current, timing, t0)
                    .await?;
                cur.i += 1;
                Ok(true)
            }
            Err(fail) => self.after_failure(blocks, cur, fail, timing, t0).await,
        }
    }

    /// Block `i` found in the cache: the hit as this run's checkpoint (with
    /// the repaired script it carries), which the next block starts from.
    async fn adopt_block(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        hit: CacheHit,
        current: &str,
        t0: Instant,
    ) -> Result<String, EnvError> {
        let adopted_script = hit
            .info
            .labels
            .get(cache::SCRIPT_LABEL)
            // Checkpoints that were not repaired carry it empty.
            .filter(|h| !h.is_empty())
            .and_then(|h| hex::decode(h).ok())
            .filter(|b| !b.is_empty())
            .and_then(|b| String::from_utf8(b).ok());
        let seq = i as u32 + 1;
        let cp = self
            .adopt_cached(hit, &blocks[i].id.clone(), seq, Some(current.to_string()))
            .await?;
        // The cached checkpoint is not in the current container.
        self.pool.retire();
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
        self.block_done(blocks, i, cp.image_ref, true, t0, detail)
    }

    /// Block `i` passed: its checkpoint under `key`, which the next block
    /// starts from.
    async fn commit_block(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        key: String,
        current: &str,
        mut timing: BlockTiming,
        t0: Instant,
    ) -> Result<String, EnvError> {
        let seq = i as u32 + 1;
        let cp_t0 = Instant::now();
        let extra = BTreeMap::from([(cache::KEY_LABEL.to_string(), key)]);
        let cp = self
            .commit(
                &blocks[i].id.clone(),
                seq,
                "success",
                Some(current.to_string()),
                extra,
            )
            .await?;
        self.pool
            .after_checkpoint(cp_t0.elapsed(), &cp.image_ref)
            .await;
        timing.checkpoint_s = round3(cp_t0.elapsed().as_secs_f64());
        timing.total_s = round3(t0.elapsed().as_secs_f64());
        self.set_last_checkpoint_after(&cp.image_ref);
        blocks[i].status = BlockStatus::Succeeded;
        blocks[i].last_error = None;
        blocks[i].timing = Some(timing);
        self.block_done(blocks, i, cp.image_ref, false, t0, String::new())
    }

    /// Block `cur.i` failed: repair it (when the ablation allows), and go on
    /// past it, back to the block a fix was patched into, or stop.
    async fn after_failure(
        &mut self,
        blocks: &mut [Block],
        cur: &mut Cursor,
        fail: Failure,
        timing: BlockTiming,
        t0: Instant,
    ) -> Result<bool, EnvError> {
        let i = cur.i;
        let outcome = if self.opts.ablation.local_repair() {
            self.recover(blocks, i, &cur.current, fail, &mut cur.rollbacks)
                .await?
        } else {
            Recovery::Failed(format!(
                "{} (local repair is off in this ablation mode)",
                fail.summary
            ))
        };
        match outcome {
            Recovery::Repaired(cp) => {
                let mut t = blocks[i].timing.clone().unwrap_or_default();
                t.total_s = round3(t0.elapsed().as_secs_f64());
                blocks[i].timing = Some(t);
                let detail = format!("repaired after {} attempt(s)", blocks[i].repair_attempts);
                cur.current = self.block_done(blocks, i, cp, false, t0, detail)?;
                cur.i += 1;
            }
            Recovery::RollBack(j) if j < self.laid_under => {
                (cur.i, cur.current) = self.roll_back_under_copy(blocks, i, j).await?;
            }
            Recovery::RollBack(j) => {
                cur.current = self.roll_back(blocks, i, j)?;
                cur.i = j;
            }
            Recovery::Failed(err) => {
                self.block_failed(blocks, i, err, timing, t0)?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A fix was patched into block `j`, which is under the repository copy:
    /// it, and the blocks after it, move above a new copy. Returns the block
    /// to run next and the new workspace checkpoint.
    async fn roll_back_under_copy(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        j: usize,
    ) -> Result<(usize, String), EnvError> {
        self.pool.retire();
        // The workspace too: it sits on the old toolchain.
        self.retire_checkpoints(0)?;
        for b in blocks.iter_mut().skip(j) {
            b.before_workspace = false;
        }
        for b in blocks.iter_mut().take(i + 1).skip(j) {
            b.status = BlockStatus::Planned;
            b.cached = false;
        }
        for b in blocks.iter().skip(j) {
            self.records.save_block(b)?;
        }
        self.phase(
            "rollback",
            format!(
                "back to {}, which now runs after the repository copy",
                blocks[j].id
            ),
        );
        let (k, ws) = self.lay(blocks).await?;
        self.pool.set_checkpoint(ws.clone());
        self.manifest.blocks = blocks.to_vec();
        self.save()?;
        Ok((k, ws))
    }

    /// A fix was patched into block `j`: back to its baseline checkpoint,
    /// which is returned; blocks `j..=i` run again.
    fn roll_back(&mut self, blocks: &mut [Block], i: usize, j: usize) -> Result<String, EnvError> {
        let current = blocks[j].baseline_checkpoint.clone().ok_or_else(|| {
            EnvError::Usage(format!(
                "block {} has no baseline checkpoint to roll back to",
                blocks[j].id
            ))
        })?;
        self.pool.set_checkpoint(current.clone());
        self.pool.retire();
        // Checkpoints from block j on are stale: a resume must not
        // pick them over the patched block.
        self.retire_checkpoints(j as u32 + 1)?;
        for b in blocks.iter_mut().take(i + 1).skip(j) {
            b.status = BlockStatus::Planned;
            b.cached = false;
        }
        for b in blocks.iter().take(i + 1).skip(j) {
            self.records.save_block(b)?;
        }
        self.manifest.blocks = blocks.to_vec();
        self.save()?;
        self.phase("rollback", format!("back to {} ({current})", blocks[j].id));
        Ok(current)
    }

    /// Block `i` failed for good (`err`): its state, and the build's error.
    fn block_failed(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        err: String,
        timing: BlockTiming,
        t0: Instant,
    ) -> Result<(), EnvError> {
        let b = &mut blocks[i];
        b.status = BlockStatus::Failed;
        b.last_error = Some(err.clone());
        b.timing = Some(timing);
        self.records.save_block_and_script(&blocks[i])?;
        self.manifest.blocks = blocks.to_vec();
        self.obs.event(&BuildEvent::BlockFinished {
            id: blocks[i].id.clone(),
            ok: false,
            cached: false,
            duration: t0.elapsed(),
            detail: err.clone(),
        });
        self.manifest.error = Some(format!("block {} failed: {err}", blocks[i].id));
        Ok(())
    }

    /// Record that block `i` runs now: its file, the manifest, the event.
    pub(super) fn block_started(&mut self, blocks: &mut [Block], i: usize) -> Result<(), EnvError> {
        blocks[i].status = BlockStatus::Running;
        blocks[i].cached = false;
        self.records.save_block(&blocks[i])?;
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
    pub(super) fn block_done(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        checkpoint: String,
        cached: bool,
        t0: Instant,
        detail: String,
    ) -> Result<String, EnvError> {
        blocks[i].success_checkpoint = Some(checkpoint.clone());
        self.pool.set_checkpoint(checkpoint.clone());
        self.records.save_block_and_script(&blocks[i])?;
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
    pub(super) async fn run_whole_script(
        &mut self,
        block: &str,
        phase: &str,
        name: &str,
        text: &str,
    ) -> Result<Result<(), Failure>, EnvError> {
        let path = format!("{SCRIPTS_DIR}/{name}");
        let container = self.pool.id().unwrap_or_default().to_string();
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
    pub(super) fn set_last_checkpoint_after(&mut self, image_ref: &str) {
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
            self.records.save_block(b)?;
        }
        self.manifest.blocks = blocks.to_vec();
        self.save()?;
        Ok(Some(cp.image_ref))
    }
}
