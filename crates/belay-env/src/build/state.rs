//! The run's records: the manifest (interim and final), block files and scripts,
//! the execution log, attempt numbers, and what a resume reads back.

use super::*;

/// The previous manifest of a run, with its executions: an interim one (a
/// killed build) has them in `executions.jsonl` (whole lines only: a line
/// torn by the kill is skipped).
pub(super) fn read_manifest(dir: &RunDir) -> Result<Option<Manifest>, EnvError> {
    let p = dir.manifest();
    // host-owned: the run dir belay writes (records, never mounted into a build).
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
        let cps = dir.checkpoints();
        // host-owned: the run dir's checkpoint log, which belay appends to.
        m.checkpoints = match fs_err::read_to_string(&cps) {
            Ok(t) => crate::manifest::replay_checkpoints(&t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(EnvError::io("cannot read", cps, e)),
        };
        let log = dir.executions();
        // host-owned: the run dir's execution log, which belay appends to.
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

pub(super) fn read_blocks(dir: &RunDir) -> Result<Option<Vec<Block>>, EnvError> {
    let d = dir.blocks_dir();
    let mut blocks = Vec::new();
    // host-owned: the run dir's block files, which belay wrote.
    let rd = match fs_err::read_dir(&d) {
        Ok(rd) => rd,
        Err(_) => return Ok(None),
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            // host-owned: a block file belay wrote in the run dir.
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

pub(super) fn new_manifest(
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
        dockerfile_legacy_path: None,
        base_image: previous.and_then(|p| p.base_image.clone()),
        base_suite: None,
        final_image: None,
        error: None,
        failure_class: None,
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
        toolchain: previous.and_then(|p| p.toolchain.clone()),
        oracle: None,
        cache: CacheStats {
            enabled: opts.cache,
            ..Default::default()
        },
        registry: None,
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

impl Run<'_> {
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
    pub(super) fn write_llm_usage(&mut self) -> Result<(), EnvError> {
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

    /// The interim manifest: everything but the executions, checkpoints
    /// (appended to `executions.jsonl` and `checkpoints.jsonl` as they
    /// happen) and blocks (each in `blocks/<id>.json`), so that rewriting it
    /// after every block does not grow with the build.
    pub(crate) fn save(&mut self) -> Result<(), EnvError> {
        self.manifest.duration_s = round3(self.started.elapsed().as_secs_f64());
        let executions = std::mem::take(&mut self.manifest.executions);
        let blocks = std::mem::take(&mut self.manifest.blocks);
        let checkpoints = std::mem::take(&mut self.manifest.checkpoints);
        self.manifest.complete = false;
        let r = write_redacted_json(&self.dir.manifest(), &self.manifest, &self.redactor);
        self.manifest.executions = executions;
        self.manifest.blocks = blocks;
        self.manifest.checkpoints = checkpoints;
        r
    }

    /// The final manifest, with every execution, written once.
    pub(super) fn save_final(&mut self) -> Result<(), EnvError> {
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
        self.obs.event(&BuildEvent::Executed {
            block: exec.block_id.clone(),
            phase: exec.phase.clone(),
            attempt: exec.attempt,
            exit_code: exec.exit_code,
            timed_out: exec.timed_out,
            duration: Duration::try_from_secs_f64(exec.duration_s.max(0.0))
                .unwrap_or(Duration::MAX),
        });
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
}
