//! Commands in the build container: a block's script, its validation, a list of
//! commands, each recorded with its log.

use super::*;

impl Run<'_> {
    /// Run `argv` in the current container, log it, and record an execution.
    pub(crate) async fn exec(
        &mut self,
        block: &str,
        phase: &str,
        argv: Vec<String>,
        display: &str,
        timeout: Duration,
        repair_command: Option<String>,
    ) -> Result<(ExecOutcome, PathBuf), EnvError> {
        let (out, run) = self.exec_unrecorded(block, phase, argv, timeout).await?;
        self.record(Execution {
            block_id: block.to_string(),
            phase: phase.to_string(),
            attempt: run.attempt,
            exit_code: Some(out.exit_code),
            timed_out: out.timed_out,
            stdout_tail: out.stdout_tail.clone(),
            stderr_tail: out.stderr_tail.clone(),
            checkpoint_before: self.pool.checkpoint(),
            checkpoint_after: None,
            repair_command,
            duration_s: round3(out.duration.as_secs_f64()),
            command: display.to_string(),
            log_path: Some(run.log_path.clone()),
            started_at: run.started_at,
        })?;
        Ok((out, run.log_path))
    }

    /// Run `argv` in the current container with its log; the caller records it.
    async fn exec_unrecorded(
        &mut self,
        block: &str,
        phase: &str,
        argv: Vec<String>,
        timeout: Duration,
    ) -> Result<(ExecOutcome, ExecRun), EnvError> {
        let container = self.pool.require()?;
        let attempt = self.records.next_attempt(block, phase);
        let log_path = self.dir.log_path(block, phase, attempt);
        let started_at = belay_record::now_rfc3339();
        let spec = ExecSpec {
            argv,
            working_dir: Some(REPO_DIR.to_string()),
            env: {
                let mut env = self.trust.proxy_env.clone();
                if let Some(c) = &self.package_caches {
                    env.extend(c.exec_env());
                }
                env
            },
            timeout: Some(timeout),
            log_path: log_path.clone(),
            log_limit: None,
        };
        let observer = BlockOutput {
            block,
            observer: self.obs,
        };
        let out = self
            .rt
            .exec(&container, &spec, &self.redactor, &observer)
            .await?;
        Ok((
            out,
            ExecRun {
                attempt,
                log_path,
                started_at,
            },
        ))
    }

    /// A block's script and then its validation in one exec (see
    /// [`crate::block_exec`]): the script is written by the exec itself, and
    /// the two are recorded as the `block` and `validation` executions they
    /// always were, sharing one log. `--command-timeout` bounds the two
    /// together.
    pub(crate) async fn run_block(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<(Result<(), Failure>, BlockTiming), EnvError> {
        // A stop between blocks is seen here even when nothing awaits.
        if let Some(why) = self.opts.stop.reason() {
            return Err(super::interrupted(&why));
        }
        let mut timing = BlockTiming::default();
        let path = block.container_script_path();
        let script = self.redactor.redact(&block.script).into_owned();
        let inline = script.len() <= crate::block_exec::INLINE_SCRIPT_MAX;
        if !inline {
            let container = self.pool.id().unwrap_or_default().to_string();
            self.rt
                .put_files(
                    &container,
                    &[(path.clone(), script.clone().into_bytes(), 0o755)],
                )
                .await?;
        }
        let argv = crate::block_exec::argv(
            &path,
            &block.validation_command,
            inline.then_some(script.as_str()),
        );
        let timeout = self.opts.command_timeout;
        let (out, run) = self
            .exec_unrecorded(&block.id, phase, argv, timeout)
            .await?;
        // The wrapper exits 0 only after the validation passed, so a lost
        // status line (a background process of the block flooding the tail)
        // still reads as one.
        let status = crate::block_exec::parse_status(&out.stderr_tail).or_else(|| {
            out.success().then_some(crate::block_exec::Status {
                validation_exit: 0,
                split: None,
            })
        });
        let stdout_tail = crate::block_exec::strip_status(&out.stdout_tail);
        let stderr_tail = crate::block_exec::strip_status(&out.stderr_tail);
        let total = out.duration.as_secs_f64();
        let (script_s, validation_s) = status
            .as_ref()
            .and_then(|s| crate::block_exec::plausible_split(s, total))
            .unwrap_or((total, 0.0));
        let checkpoint_before = self.pool.checkpoint();
        let script_exit = if status.is_some() { 0 } else { out.exit_code };
        self.record(Execution {
            block_id: block.id.clone(),
            phase: phase.to_string(),
            attempt: run.attempt,
            exit_code: Some(script_exit),
            timed_out: out.timed_out && status.is_none(),
            stdout_tail: stdout_tail.clone(),
            stderr_tail: stderr_tail.clone(),
            checkpoint_before: checkpoint_before.clone(),
            checkpoint_after: None,
            repair_command: None,
            duration_s: round3(script_s),
            command: format!("bash {path}"),
            log_path: Some(run.log_path.clone()),
            started_at: run.started_at.clone(),
        })?;
        timing.script_s = round3(script_s);
        let shown = ExecOutcome {
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            duration: out.duration,
            stdout_tail,
            stderr_tail,
            log_bytes: out.log_bytes,
        };
        let Some(st) = status else {
            // Killed (the timeout) or crashed before the status line: the
            // boundary line says whether the validation had started.
            let what = if crate::block_exec::validation_started(&out.stderr_tail) {
                format!("validation `{}`", block.validation_command)
            } else {
                "the block script".to_string()
            };
            return Ok((
                Err(failure(
                    &what,
                    &shown,
                    run.log_path,
                    self.opts.command_timeout,
                )),
                timing,
            ));
        };
        let attempt = self.records.next_attempt(&block.id, "validation");
        self.record(Execution {
            block_id: block.id.clone(),
            phase: "validation".into(),
            attempt,
            exit_code: Some(st.validation_exit),
            timed_out: out.timed_out,
            stdout_tail: shown.stdout_tail.clone(),
            stderr_tail: shown.stderr_tail.clone(),
            checkpoint_before,
            checkpoint_after: None,
            repair_command: None,
            duration_s: round3(validation_s),
            command: block.validation_command.clone(),
            log_path: Some(run.log_path.clone()),
            started_at: run.started_at,
        })?;
        timing.validation_s = round3(validation_s);
        if shown.success() {
            Ok((Ok(()), timing))
        } else {
            Ok((
                Err(failure(
                    &format!("validation `{}`", block.validation_command),
                    &shown,
                    run.log_path,
                    self.opts.command_timeout,
                )),
                timing,
            ))
        }
    }

    /// Put a block's script into the container and run it (and nothing else).
    pub(crate) async fn run_script(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<Result<f64, Failure>, EnvError> {
        let container = self.pool.id().unwrap_or_default().to_string();
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
        let (out, log) = self
            .exec(
                &block.id,
                phase,
                vec!["bash".into(), path.clone()],
                &format!("bash {path}"),
                self.opts.command_timeout,
                None,
            )
            .await?;
        Ok(if out.success() {
            Ok(out.duration.as_secs_f64())
        } else {
            Err(failure(
                "the block script",
                &out,
                log,
                self.opts.command_timeout,
            ))
        })
    }

    /// Run a block's commands one at a time, each with the script's prelude.
    pub(crate) async fn run_commands(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<Result<f64, Failure>, EnvError> {
        let (prelude, commands) = script::split_commands(&block.script);
        let mut total = 0.0;
        for cmd in commands {
            let (out, log) = self
                .exec(
                    &block.id,
                    phase,
                    vec!["bash".into(), "-c".into(), format!("{prelude}{cmd}")],
                    &cmd,
                    self.opts.command_timeout,
                    None,
                )
                .await?;
            total += out.duration.as_secs_f64();
            if !out.success() {
                return Ok(Err(failure(
                    &format!("command `{}`", first_line(&cmd)),
                    &out,
                    log,
                    self.opts.command_timeout,
                )));
            }
        }
        Ok(Ok(total))
    }

    pub(crate) async fn run_validation(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<Result<f64, Failure>, EnvError> {
        let (out, log) = self
            .exec(
                &block.id,
                phase,
                vec!["bash".into(), "-c".into(), block.validation_command.clone()],
                &block.validation_command,
                self.opts.command_timeout,
                None,
            )
            .await?;
        Ok(if out.success() {
            Ok(out.duration.as_secs_f64())
        } else {
            Err(failure(
                &format!("validation `{}`", block.validation_command),
                &out,
                log,
                self.opts.command_timeout,
            ))
        })
    }

    /// Forward execution of one block at the ablation's granularity, then its
    /// validation (in the same exec, for a whole block).
    pub(super) async fn forward_block(
        &mut self,
        block: &Block,
    ) -> Result<(Result<(), Failure>, BlockTiming), EnvError> {
        let mut timing = BlockTiming::default();
        let run = match self.opts.ablation.forward() {
            Granularity::Command => self.run_commands(block, "command_forward").await?,
            _ => return self.run_block(block, "block").await,
        };
        match run {
            Ok(s) => timing.script_s = round3(s),
            Err(f) => return Ok((Err(f), timing)),
        }
        match self.run_validation(block, "validation").await? {
            Ok(s) => timing.validation_s = round3(s),
            Err(f) => return Ok((Err(f), timing)),
        }
        Ok((Ok(()), timing))
    }
}

/// One exec's attempt number, log and start time, for its records.
struct ExecRun {
    attempt: u32,
    log_path: PathBuf,
    started_at: String,
}
