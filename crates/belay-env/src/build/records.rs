//! The run's records as they are written: the execution log, attempt
//! numbers, the manifest (interim and final), block files and scripts, and
//! `llm-usage.json`. The manifest itself is the run's (`Run::manifest`):
//! every part of the build fills it in, and these write it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use belay_record::{JsonlAppender, Redactor};

use crate::manifest::{Execution, Manifest};
use crate::plan::Block;
use crate::progress::{BuildEvent, BuildObserver};
use crate::rundir::RunDir;
use crate::EnvError;

use super::{round3, write_redacted_json};

/// Where and how the run's records are written, and what they count.
pub(crate) struct Records {
    /// The run directory the records are in.
    dir: RunDir,
    /// The run's redactor: every record passes it.
    redactor: Redactor,
    /// `executions.jsonl`: each execution as it is recorded.
    exec_log: JsonlAppender,
    /// Next attempt number per (block, phase).
    attempts: HashMap<(String, String), u32>,
    /// When the build started (for the manifest's duration).
    started: Instant,
}

impl Records {
    /// Open the execution log of `dir`. Attempt numbers continue across
    /// starts (from the `previous` manifest), so that no earlier log is
    /// overwritten.
    pub(crate) fn open(
        dir: &RunDir,
        redactor: &Redactor,
        previous: Option<&Manifest>,
        started: Instant,
    ) -> Result<Self, EnvError> {
        let mut attempts: HashMap<(String, String), u32> = HashMap::new();
        if let Some(prev) = previous {
            for e in &prev.executions {
                let n = attempts
                    .entry((e.block_id.clone(), e.phase.clone()))
                    .or_insert(0);
                *n = (*n).max(e.attempt);
            }
        }
        Ok(Self {
            dir: dir.clone(),
            redactor: redactor.clone(),
            exec_log: JsonlAppender::open(&dir.executions())?,
            attempts,
            started,
        })
    }

    /// How long the build has run.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
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

    /// Append `exec` to the execution log and the manifest, and report it.
    pub(crate) fn record(
        &mut self,
        manifest: &mut Manifest,
        obs: &dyn BuildObserver,
        exec: Execution,
    ) -> Result<(), EnvError> {
        self.exec_log.append(&exec, &self.redactor)?;
        obs.event(&BuildEvent::Executed {
            block: exec.block_id.clone(),
            phase: exec.phase.clone(),
            attempt: exec.attempt,
            exit_code: exec.exit_code,
            timed_out: exec.timed_out,
            duration: Duration::try_from_secs_f64(exec.duration_s.max(0.0))
                .unwrap_or(Duration::MAX),
        });
        manifest.executions.push(exec);
        Ok(())
    }

    /// `llm-usage.json`: the model ledger's full report (when a model was
    /// used) with the planner and fallbacks; the manifest gets the totals.
    pub(crate) fn write_llm_usage(
        &self,
        manifest: &mut Manifest,
        llm: Option<&belay_model::ModelClient>,
    ) -> Result<(), EnvError> {
        let Some(client) = llm else {
            return write_redacted_json(&self.dir.llm_usage(), &manifest.llm_usage, &self.redactor);
        };
        let r = client.ledger().report();
        let u = &mut manifest.llm_usage;
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

    /// The interim manifest: everything but the executions, checkpoints
    /// (appended to `executions.jsonl` and `checkpoints.jsonl` as they
    /// happen) and blocks (each in `blocks/<id>.json`), so that rewriting it
    /// after every block does not grow with the build.
    pub(crate) fn save(&self, manifest: &mut Manifest) -> Result<(), EnvError> {
        manifest.duration_s = round3(self.started.elapsed().as_secs_f64());
        let executions = std::mem::take(&mut manifest.executions);
        let blocks = std::mem::take(&mut manifest.blocks);
        let checkpoints = std::mem::take(&mut manifest.checkpoints);
        manifest.complete = false;
        let r = write_redacted_json(&self.dir.manifest(), manifest, &self.redactor);
        manifest.executions = executions;
        manifest.blocks = blocks;
        manifest.checkpoints = checkpoints;
        r
    }

    /// The final manifest, with every execution, written once.
    pub(crate) fn save_final(&self, manifest: &mut Manifest) -> Result<(), EnvError> {
        manifest.duration_s = round3(self.started.elapsed().as_secs_f64());
        manifest.complete = true;
        write_redacted_json(&self.dir.manifest(), manifest, &self.redactor)
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
}
