//! Local repair of a failed block.
//!
//! For up to `--max-repair-attempts` rounds: read the failure, ask the rules
//! ([`crate::repair`]) for fixes, drop those the safety filter refuses and those
//! a read-only probe shows are not needed, then restore the block's baseline
//! checkpoint (unless the ablation mode says otherwise), run the fix, and
//! replay the block and its validation. A fix that works is patched into the
//! block script and committed as a `repaired` checkpoint. A fix that belongs to
//! an earlier block (the error points at that block's output) is patched there
//! instead, and the build rolls back to it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ablation::Granularity;
use crate::plan::{Block, BlockStatus};
use crate::progress::BuildEvent;
use crate::repair::{self, Proposal};
use crate::{cache, safety, script, EnvError};

use super::{failure, round3, Failure, Run};

/// How a recovery ended.
pub(crate) enum Recovery {
    /// The block now passes: its `repaired` checkpoint.
    Repaired(String),
    /// A fix was patched into an earlier block: continue from that block.
    RollBack(usize),
    /// Nothing worked: why.
    Failed(String),
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// How a failure of the fix itself (rather than of the replay) is named.
const FIX_FAILED: &str = "the repair command";

impl Run<'_> {
    pub(crate) async fn recover(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        baseline: &str,
        first: Failure,
        rollbacks: &mut Vec<(usize, usize)>,
    ) -> Result<Recovery, EnvError> {
        let mut failure_now = first;
        let mut tried: Vec<String> = Vec::new();
        let mut probe_failures = 0u32;
        let mut history: Vec<String> = Vec::new();
        let mut applied: Vec<(String, String)> = Vec::new();
        let original_script = blocks[i].script.clone();
        for attempt in 1..=self.opts.max_repair_attempts {
            let text = repair::failure_text(
                &failure_now.log,
                &failure_now.stdout_tail,
                &failure_now.stderr_tail,
            );
            // A suite that needs the network to collect cannot be repaired
            // (and the oracle runs offline): say so rather than retry.
            if let Some(c) = repair::classify_in(&text, &self.ctx.repo_path) {
                self.manifest.failure_class = Some(c.detail.clone());
                return Ok(Recovery::Failed(format!(
                    "{}; {}",
                    failure_now.summary, c.detail
                )));
            }
            let chosen = self
                .next_proposal(blocks, i, &text, &mut tried, &mut probe_failures)
                .await?;
            let Some(p) = chosen else {
                let mut why = format!(
                    "{}; no repair rule matches this failure",
                    failure_now.summary
                );
                if !history.is_empty() {
                    why.push_str(&format!(" (tried: {})", history.join("; ")));
                }
                return Ok(Recovery::Failed(why));
            };
            tried.push(p.fix.clone());
            history.push(p.rule_id.clone());
            self.obs.event(&BuildEvent::Repair {
                block: blocks[i].id.clone(),
                rule: p.rule_id.clone(),
                hint: p.hint.clone(),
                attempt,
            });
            self.phase(
                "repair",
                format!(
                    "{} attempt {attempt}: {} ({})",
                    blocks[i].id, p.rule_id, p.hint
                ),
            );

            // The error points at an earlier block's output: fix it there.
            if let Some(j) = self.patch_blamed_block(blocks, i, baseline, &p, rollbacks)? {
                return Ok(Recovery::RollBack(j));
            }

            blocks[i].repair_attempts = attempt;
            // Each round restores the baseline, so the fixes of earlier rounds
            // that ran cleanly run again first: a fix that made progress (the
            // next failure is a different one) is kept, not lost.
            let note = format!("{} (attempt {attempt}): {}", p.rule_id, p.hint);
            let mut fixes: Vec<&str> = applied
                .iter()
                .map(|(f, _): &(String, String)| f.as_str())
                .collect();
            fixes.push(&p.fix);
            let this_round = Proposal {
                fix: fixes.join("\n"),
                ..p.clone()
            };
            let outcome = self
                .repair_attempt(blocks, i, baseline, &this_round)
                .await?;
            match outcome {
                Err(f) => {
                    if !f.summary.starts_with(FIX_FAILED) {
                        applied.push((p.fix.clone(), note));
                    }
                    failure_now = f
                }
                Ok(()) => {
                    self.manifest.repairs += 1;
                    applied.push((p.fix.clone(), note));
                    let image_ref = self
                        .commit_repaired(blocks, i, baseline, &original_script, &applied)
                        .await?;
                    return Ok(Recovery::Repaired(image_ref));
                }
            }
        }
        Ok(Recovery::Failed(format!(
            "{}; still failing after {} repair attempt(s) ({})",
            failure_now.summary,
            self.opts.max_repair_attempts,
            history.join("; ")
        )))
    }

    /// The fix to try next for the failure `text` of `blocks[i]`: the model's
    /// or the rules', else one for libraries an import failure hides.
    async fn next_proposal(
        &mut self,
        blocks: &[Block],
        i: usize,
        text: &str,
        tried: &mut Vec<String>,
        probe_failures: &mut u32,
    ) -> Result<Option<Proposal>, EnvError> {
        let lookups = self.lookups(text).await;
        let mut proposals = repair::propose_with(text, &self.ctx, tried.as_slice(), &lookups);
        if let Some(p) = self
            .llm_proposal(blocks, i, text, &proposals, tried.as_slice())
            .await?
        {
            proposals.insert(0, p);
        }
        match self
            .choose(&blocks[i].id, proposals, tried, probe_failures)
            .await?
        {
            Some(p) => Ok(Some(p)),
            None => match self.hidden_libraries(text, tried.as_slice()).await {
                Some(p) => {
                    self.choose(&blocks[i].id, vec![p], tried, probe_failures)
                        .await
                }
                None => Ok(None),
            },
        }
    }

    /// When `p` blames an earlier block that can be rolled back to, patch the
    /// fix into it and record the rollback: that block's index.
    fn patch_blamed_block(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        baseline: &str,
        p: &Proposal,
        rollbacks: &mut Vec<(usize, usize)>,
    ) -> Result<Option<usize>, EnvError> {
        let Some(role) = &p.blame else {
            return Ok(None);
        };
        let Some(j) = repair::block_for_role(blocks.iter().map(|b| b.id.as_str()), role) else {
            return Ok(None);
        };
        if j < i
            && blocks[j].baseline_checkpoint.is_some()
            && self.opts.ablation.checkpoint_rollback()
            && !rollbacks.contains(&(i, j))
        {
            rollbacks.push((i, j));
            let note = format!("{} (for {} failing: {})", p.rule_id, blocks[i].id, p.hint);
            blocks[j].script = script::patch_script(&blocks[j].script, &p.fix, &note);
            blocks[j].repair_attempts += 1;
            self.manifest.repairs += 1;
            self.records.save_block_and_script(&blocks[j])?;
            self.record_note(
                &blocks[i].id,
                &format!(
                    "blame {}: roll back and patch `{}` into it",
                    blocks[j].id, p.fix
                ),
                baseline,
            )?;
            return Ok(Some(j));
        }
        Ok(None)
    }

    /// Run this round's fixes and replay `blocks[i]` the way the ablation's
    /// recovery granularity says.
    async fn repair_attempt(
        &mut self,
        blocks: &[Block],
        i: usize,
        baseline: &str,
        this_round: &Proposal,
    ) -> Result<Result<(), Failure>, EnvError> {
        Ok(match self.opts.ablation.recovery() {
            Granularity::WholeScript => self.repair_whole_script(blocks, i, this_round).await?,
            Granularity::Command => self.repair_commands(&blocks[i].clone(), this_round).await?,
            Granularity::Block => {
                self.repair_block(&blocks[i].clone(), baseline, this_round)
                    .await?
            }
        })
    }

    /// Patch the `applied` fixes into `blocks[i]`, mark it repaired and commit
    /// its `repaired` checkpoint: the checkpoint's image.
    async fn commit_repaired(
        &mut self,
        blocks: &mut [Block],
        i: usize,
        baseline: &str,
        original_script: &str,
        applied: &[(String, String)],
    ) -> Result<String, EnvError> {
        // Patched in reverse, so that the script runs them in order.
        for (fix, note) in applied.iter().rev() {
            blocks[i].script = script::patch_script(&blocks[i].script, fix, note);
        }
        blocks[i].status = BlockStatus::Repaired;
        blocks[i].last_error = None;
        let mut extra = BTreeMap::new();
        // A later run that plans the same original script on the same
        // parent finds this checkpoint, and adopts the patched script.
        let parent_id = self.store.image_id(baseline).await?;
        extra.insert(
            cache::ALT_LABEL.to_string(),
            cache::block_key(
                &parent_id,
                &blocks[i].id,
                original_script,
                &blocks[i].validation_command,
                &self.env_fingerprint,
            ),
        );
        extra.insert(
            cache::KEY_LABEL.to_string(),
            cache::block_key(
                &parent_id,
                &blocks[i].id,
                &blocks[i].script,
                &blocks[i].validation_command,
                &self.env_fingerprint,
            ),
        );
        extra.insert(
            cache::SCRIPT_LABEL.to_string(),
            hex::encode(&blocks[i].script),
        );
        let cp_t0 = std::time::Instant::now();
        let cp = self
            .commit(
                &blocks[i].id.clone(),
                i as u32 + 1,
                "repaired",
                Some(baseline.to_string()),
                extra,
            )
            .await?;
        let mut t = blocks[i].timing.clone().unwrap_or_default();
        t.checkpoint_s = round3(cp_t0.elapsed().as_secs_f64());
        blocks[i].timing = Some(t);
        self.pool
            .after_checkpoint(cp_t0.elapsed(), &cp.image_ref)
            .await;
        self.set_last_checkpoint_after(&cp.image_ref);
        blocks[i].success_checkpoint = Some(cp.image_ref.clone());
        Ok(cp.image_ref)
    }

    /// Ask the model for a fix (when a model is configured). It may first ask
    /// for read-only probes, which run here (validated) as `llm_probe`. Any
    /// failure is logged and the rules answer instead.
    async fn llm_proposal(
        &mut self,
        blocks: &[Block],
        i: usize,
        failure_text: &str,
        rules: &[Proposal],
        tried: &[String],
    ) -> Result<Option<Proposal>, EnvError> {
        let Some(client) = self.llm.clone() else {
            return Ok(None);
        };
        let block = &blocks[i];
        let notes = self.ctx.runtime_notes.clone();
        let input = crate::llm::RepairInput {
            block,
            failure: failure_text,
            notes: notes.as_ref(),
            hints: rules
                .iter()
                .map(|p| (p.rule_id.clone(), p.hint.clone(), p.fix.clone()))
                .collect(),
            tried,
            earlier: blocks[..i].iter().map(|b| b.id.clone()).collect(),
        };
        let t0 = std::time::Instant::now();
        let mut said = Vec::new();
        let mut answer = crate::llm::repair(&client, &input, &[], &mut |m| said.push(m)).await;
        if let Ok(a) = &answer {
            if a.fix.is_none() && !a.probes.is_empty() {
                let mut results = Vec::new();
                for probe in a.probes.clone() {
                    let (out, log) = self
                        .exec(
                            &block.id,
                            "llm_probe",
                            vec!["bash".into(), "-c".into(), probe.clone()],
                            &probe,
                            PROBE_TIMEOUT,
                            None,
                        )
                        .await?;
                    let mut text = repair::failure_text(&log, &out.stdout_tail, &out.stderr_tail);
                    if text.len() > 2048 {
                        let mut cut = text.len() - 2048;
                        while !text.is_char_boundary(cut) {
                            cut += 1;
                        }
                        text.replace_range(..cut, "");
                    }
                    results.push((probe, out.exit_code, text));
                }
                answer = crate::llm::repair(&client, &input, &results, &mut |m| said.push(m)).await;
            }
        }
        for m in said {
            self.phase("repair", m);
        }
        match answer {
            Ok(a) => {
                let Some(fix) = a.fix.clone() else {
                    return Ok(None);
                };
                if tried.contains(&fix) {
                    self.phase(
                        "repair",
                        "the model proposed a fix already tried; using the rules",
                    );
                    return Ok(None);
                }
                let what = format!(
                    "model repair: {} -> `{}`",
                    a.diagnosis,
                    fix.replace('\n', "; ")
                );
                self.record_phase(&block.id, "llm_repair", &what, true, t0.elapsed())?;
                Ok(Some(Proposal {
                    rule_id: "llm".into(),
                    fix,
                    probe: None,
                    blame: a
                        .blame
                        .as_deref()
                        .and_then(|b| b.split_once('-'))
                        .map(|(_, role)| role.to_string()),
                    hint: if a.diagnosis.is_empty() {
                        "the model's fix".into()
                    } else {
                        a.diagnosis
                    },
                }))
            }
            Err(why) => {
                let what =
                    format!("the model repair failed ({why}); falling back to the repair rules");
                self.phase("repair", what.clone());
                self.manifest
                    .llm_usage
                    .fallbacks
                    .push(format!("repair {}: {why}", block.id));
                self.record_phase(&block.id, "llm_repair", &what, false, t0.elapsed())?;
                Ok(None)
            }
        }
    }

    /// The first proposal that the safety filter allows and that a probe does
    /// not show to be unnecessary.
    async fn choose(
        &mut self,
        block: &str,
        proposals: Vec<Proposal>,
        tried: &mut Vec<String>,
        probe_failures: &mut u32,
    ) -> Result<Option<Proposal>, EnvError> {
        for p in proposals {
            if let Some(why) = safety::check_repair(&p.fix) {
                self.phase("repair", why);
                tried.push(p.fix.clone());
                continue;
            }
            if let Some(probe) = &p.probe {
                if *probe_failures < self.opts.max_probe_failures && self.pool.id().is_some() {
                    if let Some(why) = safety::check_probe(probe) {
                        self.phase("repair", why);
                    } else {
                        let (out, _) = self
                            .exec(
                                block,
                                "probe",
                                vec!["bash".into(), "-c".into(), probe.clone()],
                                probe,
                                PROBE_TIMEOUT,
                                None,
                            )
                            .await?;
                        if out.success() {
                            // What the fix would provide is already there.
                            tried.push(p.fix.clone());
                            continue;
                        }
                        *probe_failures += 1;
                    }
                }
            }
            return Ok(Some(p));
        }
        Ok(None)
    }

    /// Run a fix in the current container, recorded as a `repair` execution.
    async fn run_fix(&mut self, block: &str, fix: &str) -> Result<Result<(), Failure>, EnvError> {
        let (out, log) = self
            .exec(
                block,
                "repair",
                vec![
                    "bash".into(),
                    "-c".into(),
                    format!("set -eo pipefail\ncd /workspace/repo\n{fix}"),
                ],
                fix,
                self.opts.command_timeout,
                Some(fix.to_string()),
            )
            .await?;
        Ok(if out.success() {
            Ok(())
        } else {
            Err(failure(FIX_FAILED, &out, log, self.opts.command_timeout))
        })
    }

    /// Block recovery: restore the baseline (unless rollback is off), run the
    /// fix, replay the block and its validation.
    async fn repair_block(
        &mut self,
        block: &Block,
        baseline: &str,
        p: &Proposal,
    ) -> Result<Result<(), Failure>, EnvError> {
        if self.opts.ablation.checkpoint_rollback() {
            self.pool.retire();
            self.start_container(baseline).await?;
            self.record_note(
                &block.id,
                &format!("repair_prep: recreate the container from {baseline}"),
                baseline,
            )?;
        } else {
            // The fix runs on top of the failed attempt's leftovers.
            self.diverged = true;
        }
        if let Err(f) = self.run_fix(&block.id, &p.fix).await? {
            return Ok(Err(f));
        }
        Ok(self.run_block(block, "block").await?.0)
    }

    /// Command recovery: in the live container, run the fix, then the block's
    /// commands one by one, then the validation.
    async fn repair_commands(
        &mut self,
        block: &Block,
        p: &Proposal,
    ) -> Result<Result<(), Failure>, EnvError> {
        self.diverged = true;
        if let Err(f) = self.run_fix(&block.id, &p.fix).await? {
            return Ok(Err(f));
        }
        if let Err(f) = self.run_commands(block, "command_recovery").await? {
            return Ok(Err(f));
        }
        Ok(self.run_validation(block, "validation").await?.map(|_| ()))
    }

    /// Whole-script recovery: from the workspace checkpoint, run the fix, then
    /// every block up to the failed one as one script, then its validation.
    async fn repair_whole_script(
        &mut self,
        blocks: &[Block],
        i: usize,
        p: &Proposal,
    ) -> Result<Result<(), Failure>, EnvError> {
        let workspace = self
            .manifest
            .checkpoints
            .iter()
            .find(|c| c.block_id == "workspace")
            .map(|c| c.image_ref.clone())
            .ok_or_else(|| {
                EnvError::Usage(
                    "whole-script recovery needs the workspace checkpoint of this run".into(),
                )
            })?;
        self.pool.retire();
        self.start_container(&workspace).await?;
        self.record_note(
            &blocks[i].id,
            &format!("repair_prep: recreate the container from {workspace}"),
            &workspace,
        )?;
        if let Err(f) = self.run_fix(&blocks[i].id, &p.fix).await? {
            return Ok(Err(f));
        }
        let text = script::whole_script(
            blocks[..=i]
                .iter()
                .map(|b| (b.id.as_str(), b.script.as_str())),
        );
        if let Err(f) = self
            .run_whole_script(
                &blocks[i].id,
                "whole_script_recovery",
                "whole-script-recovery.sh",
                &text,
            )
            .await?
        {
            return Ok(Err(f));
        }
        Ok(self
            .run_validation(&blocks[i], "validation")
            .await?
            .map(|_| ()))
    }

    /// A bookkeeping record (no command ran in the container).
    fn record_note(&mut self, block: &str, what: &str, checkpoint: &str) -> Result<(), EnvError> {
        let attempt = self.records.next_attempt(block, "repair_prep");
        self.record(crate::manifest::Execution {
            block_id: block.to_string(),
            phase: "repair_prep".into(),
            attempt,
            exit_code: Some(0),
            timed_out: false,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            checkpoint_before: Some(checkpoint.to_string()),
            checkpoint_after: None,
            repair_command: None,
            duration_s: 0.0,
            command: what.to_string(),
            log_path: None,
            started_at: belay_record::now_rfc3339(),
        })
    }
}
