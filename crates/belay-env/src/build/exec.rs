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
        let container = self
            .container
            .clone()
            .ok_or_else(|| EnvError::Usage("no build container".into()))?;
        let attempt = self.next_attempt(block, phase);
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
        let checkpoint_before = self.current_checkpoint.clone();
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
            repair_command,
            duration_s: round3(out.duration.as_secs_f64()),
            command: display.to_string(),
            log_path: Some(log_path.clone()),
            started_at,
        })?;
        Ok((out, log_path))
    }

    /// Put a block's script into the container and run it (and nothing else).
    pub(crate) async fn run_script(
        &mut self,
        block: &Block,
        phase: &str,
    ) -> Result<Result<f64, Failure>, EnvError> {
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
    /// validation.
    pub(super) async fn forward_block(
        &mut self,
        block: &Block,
    ) -> Result<(Result<(), Failure>, BlockTiming), EnvError> {
        let mut timing = BlockTiming::default();
        let run = match self.opts.ablation.forward() {
            Granularity::Command => self.run_commands(block, "command_forward").await?,
            _ => self.run_script(block, "block").await?,
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
