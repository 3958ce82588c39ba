//! The last phase of a build, finalize: the clean replay, the final image,
//! the Dockerfile and scripts, the oracle. Then, whatever happened, the end of
//! the run: the wait for the registry's pushes and the final manifest.

use super::*;

/// Where preflight results are cached: the machine's cache directory.
pub(super) fn preflight_cache_dir(state_dir: &Path) -> PathBuf {
    crate::rundir::machine_cache_dir(state_dir)
}

/// Where a passed oracle command is remembered: keyed by the image id and the
/// command, next to the preflight cache.
pub(super) fn oracle_cache_file(state_dir: &Path, image_id: &str, command: &str) -> PathBuf {
    use sha2::Digest;
    let key = hex::encode(sha2::Sha256::digest(
        format!("{image_id}\n{command}").as_bytes(),
    ));
    preflight_cache_dir(state_dir)
        .join("oracle")
        .join(format!("{key}.passed"))
}

/// The class of the first failed oracle command, from its log.
fn report_failure_class(
    report: Option<&OracleReport>,
    repo: &std::path::Path,
) -> Option<crate::repair::Classified> {
    report?.commands.iter().filter(|c| !c.ok).find_map(|c| {
        crate::repair::classify_in(&crate::repair::failure_text(&c.log_path, "", ""), repo)
    })
}

impl Run<'_> {
    /// The final image: the last checkpoint with the final variables
    /// ([`crate::dockerfile::final_env`]: the project's tools first on
    /// `PATH`), as the written Dockerfile's last line sets them. One
    /// config-only layer, no container run.
    async fn final_image(
        &mut self,
        blocks: &[Block],
        source: &str,
        final_ref: &str,
    ) -> Result<(), EnvError> {
        let dir = self.dir.logs_dir().join("final-image");
        fs_err::create_dir_all(&dir).map_err(|e| EnvError::io("cannot create", &dir, e))?;
        let df = dir.join("Dockerfile");
        let text = format!(
            "FROM {source}\nENV {}\n",
            crate::dockerfile::final_env(blocks).join(" ")
        );
        fs_err::write(&df, text).map_err(|e| EnvError::io("cannot write", &df, e))?;
        let mut lbl = BTreeMap::new();
        lbl.insert(labels::BELAY.to_string(), "true".to_string());
        lbl.insert(labels::RUN.to_string(), self.dir.run_id.clone());
        let attempt = self.records.next_attempt("finalize", "final_image");
        self.rt
            .build(
                &BuildRequest {
                    dockerfile: df,
                    context_dir: dir,
                    tag: final_ref.to_string(),
                    labels: lbl,
                    timeout: self.opts.docker_build_timeout,
                    log_path: self.dir.log_path("finalize", "final_image", attempt),
                    network: Network::None,
                },
                &self.redactor,
            )
            .await?;
        Ok(())
    }

    /// Phase 4: the clean replay (when the forward run may differ from a
    /// clean run of the final scripts), then the final image from `current`,
    /// the Dockerfiles and the oracle.
    pub(super) async fn finalize(
        &mut self,
        blocks: &[Block],
        current: String,
    ) -> Result<(), EnvError> {
        let mut final_source = current;
        let repaired =
            blocks.iter().any(|b| b.status == BlockStatus::Repaired) || self.manifest.repairs > 0;
        if self.opts.ablation.final_clean_replay() {
            if repaired || self.diverged || self.opts.force_clean_replay {
                match self.clean_replay(blocks).await? {
                    Some(img) => final_source = img,
                    None => return Ok(()),
                }
            } else {
                self.manifest.final_clean_replay_ok = Some(true);
                self.manifest.final_clean_replay_image = Some(final_source.clone());
                self.manifest.final_clean_replay_note = Some(
                    "no repair changed the scripts: the forward run executed exactly the final scripts, in order, from the base image (use --force-clean-replay to run them again)".into(),
                );
            }
        } else {
            self.manifest.final_clean_replay_note =
                Some(format!("disabled by --ablation {}", self.opts.ablation));
        }
        let t0 = Instant::now();
        let final_ref = self.store.final_name();
        // The oracle and a kept container need the image on this engine.
        let needs_local =
            self.opts.pull_final || self.opts.oracle_file.is_some() || self.opts.keep_container;
        let in_registry = !needs_local && self.store.final_in_registry(&final_source, &final_ref);
        let command = if in_registry {
            format!("registry tag {final_source} {final_ref}")
        } else {
            self.ensure_local(&final_source).await?;
            self.final_image(blocks, &final_source, &final_ref).await?;
            format!(
                "docker build (FROM {final_source}; ENV {}) -t {final_ref}",
                crate::dockerfile::final_env(blocks).join(" ")
            )
        };
        self.record(Execution {
            block_id: "finalize".into(),
            phase: "finalize".into(),
            attempt: 1,
            exit_code: Some(0),
            timed_out: false,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            checkpoint_before: Some(final_source.clone()),
            checkpoint_after: Some(final_ref.clone()),
            repair_command: None,
            duration_s: round3(t0.elapsed().as_secs_f64()),
            command,
            log_path: None,
            started_at: belay_record::now_rfc3339(),
        })?;
        self.manifest.final_image = Some(final_ref.clone());
        self.write_dockerfiles(blocks)?;
        if let Some(file) = self.opts.oracle_file.clone() {
            let report = self.run_oracle(&file, &final_ref).await?;
            let ok = report.ok;
            self.manifest.oracle = Some(report);
            if !ok {
                // The oracle runs offline: a suite that needs the network to
                // collect is named as such, with its host.
                let class =
                    report_failure_class(self.manifest.oracle.as_ref(), &self.ctx.repo_path);
                let why = class
                    .as_ref()
                    .map(|c| format!(": {}", c.detail))
                    .unwrap_or_default();
                self.manifest.failure_class = class.map(|c| c.detail);
                self.manifest.error = Some(format!(
                    "the oracle {} failed on {final_ref}{why}",
                    file.display()
                ));
                return Ok(());
            }
        }
        self.manifest.ok = true;
        // Only an image that passed its oracle is published as final.
        if !in_registry {
            self.store.share_final(&final_ref);
        }
        Ok(())
    }

    /// The `Dockerfile` (BuildKit) and `Dockerfile.legacy` that rebuild the
    /// final image from the base with the final scripts.
    fn write_dockerfiles(&mut self, blocks: &[Block]) -> Result<(), EnvError> {
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
        for (builder, path) in [
            (dockerfile::Builder::BuildKit, self.dir.dockerfile()),
            (dockerfile::Builder::Legacy, self.dir.dockerfile_legacy()),
        ] {
            let text = dockerfile::render(
                &self.dir.run_id,
                &base,
                blocks,
                self.trust.ca_bundle.is_some(),
                run_rel.as_deref(),
                &self.excluded,
                builder,
            );
            belay_record::atomic_write(&path, self.redactor.redact(&text).as_bytes())?;
        }
        self.manifest.dockerfile_path = Some(self.dir.dockerfile());
        self.manifest.dockerfile_legacy_path = Some(self.dir.dockerfile_legacy());
        Ok(())
    }

    pub(super) async fn run_oracle(
        &mut self,
        file: &Path,
        image: &str,
    ) -> Result<OracleReport, EnvError> {
        let commands = oracle::load(file)?;
        self.phase(
            "oracle",
            format!("{} command(s) from {}", commands.len(), file.display()),
        );
        let mut results = Vec::new();
        for (i, c) in commands.iter().enumerate() {
            let (command, rewritten_from) = if self.opts.oracle_collect_only {
                match oracle::collect_only(&c.command) {
                    Some(r) => (r, Some(c.command.clone())),
                    None => (c.command.clone(), None),
                }
            } else {
                (c.command.clone(), None)
            };
            // A command that passed on this very image before is not run again
            // (the image id pins every byte); --no-cache runs it regardless.
            let image_id = self.store.image_id(image).await?;
            let pass_file = oracle_cache_file(&self.dir.state_dir, &image_id, &command);
            if self.opts.cache && pass_file.is_file() {
                results.push(OracleCommandResult {
                    oracle_id: c.oracle_id.clone(),
                    command,
                    exit_code: Some(0),
                    timed_out: false,
                    ok: true,
                    duration_s: 0.0,
                    log_path: pass_file,
                    rewritten_from,
                });
                continue;
            }
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
            let log_path = self.dir.log_path("oracle", "oracle", i as u32 + 1);
            let exec = ExecSpec {
                argv: vec!["bash".into(), "-c".into(), command.clone()],
                working_dir: Some(REPO_DIR.to_string()),
                env: vec![],
                timeout: Some(self.opts.oracle_timeout),
                log_path: log_path.clone(),
                log_limit: None,
            };
            let res = self
                .rt
                .exec(&cid, &exec, &self.redactor, &NoopObserver)
                .await;
            self.pool.remove_later(&cid);
            let out = res?;
            self.record(Execution {
                block_id: "oracle".into(),
                phase: "oracle".into(),
                attempt: i as u32 + 1,
                exit_code: Some(out.exit_code),
                timed_out: out.timed_out,
                stdout_tail: out.stdout_tail.clone(),
                stderr_tail: out.stderr_tail.clone(),
                checkpoint_before: Some(image.to_string()),
                checkpoint_after: None,
                repair_command: None,
                duration_s: round3(out.duration.as_secs_f64()),
                command: command.clone(),
                log_path: Some(log_path.clone()),
                started_at: belay_record::now_rfc3339(),
            })?;
            if out.success() {
                if let Some(d) = pass_file.parent() {
                    if fs_err::create_dir_all(d).is_ok() {
                        let _ = belay_record::atomic_write(
                            &pass_file,
                            format!("{}\n", log_path.display()).as_bytes(),
                        );
                    }
                }
            }
            results.push(OracleCommandResult {
                oracle_id: c.oracle_id.clone(),
                command,
                exit_code: Some(out.exit_code),
                timed_out: out.timed_out,
                ok: out.success(),
                duration_s: round3(out.duration.as_secs_f64()),
                log_path,
                rewritten_from,
            });
        }
        Ok(OracleReport {
            oracle_file: file.to_path_buf(),
            ok: results.iter().all(|r| r.ok),
            commands: results,
        })
    }

    /// Record the end of the run, whatever happened.
    pub(super) async fn finish(&mut self, result: Result<(), EnvError>) -> Result<(), EnvError> {
        if let Err(e) = &result {
            self.manifest.error = Some(e.to_string());
            self.manifest.ok = false;
        }
        let interrupted = matches!(result, Err(EnvError::Interrupted(_)));
        self.manifest.status = if self.manifest.ok {
            "succeeded"
        } else if interrupted {
            "interrupted"
        } else {
            "failed"
        }
        .into();
        self.manifest.finished_at = Some(belay_record::now_rfc3339());
        self.records
            .write_llm_usage(&mut self.manifest, self.llm.as_ref())?;
        self.records.save_final(&mut self.manifest)?;
        self.obs.event(&BuildEvent::Finished {
            ok: self.manifest.ok,
            interrupted,
            final_image: self.manifest.final_image.clone(),
            error: self.manifest.error.clone(),
            duration: self.records.elapsed(),
        });
        result
    }

    /// Wait for the pushes still queued and record them in the manifest. A
    /// build whose checkpoints did not all reach the registry fails (E305),
    /// whatever else happened: its success would be a claim the registry
    /// cannot back.
    pub(super) async fn finish_pushes(
        &mut self,
        result: Result<(), EnvError>,
    ) -> Result<(), EnvError> {
        if !self.store.has_registry() {
            return result;
        }
        let queued = self.records.elapsed();
        let Some((report, failed)) = self.store.finish_pushes().await else {
            return result;
        };
        let pushed = report.pushes.iter().filter(|p| p.error.is_none()).count();
        self.phase(
            "registry",
            format!(
                "{pushed} of {} push(es) to {} in {:.1} s, {:.1} s of it after the last block; {} of {} lookup(s) hit, {} pull(s)",
                report.pushes.len(),
                report.registry,
                report.push_ms_total as f64 / 1000.0,
                report.waited_ms as f64 / 1000.0,
                report.hits,
                report.lookups,
                report.pulls.len(),
            ),
        );
        tracing::debug!(
            build_ms = queued.as_millis() as u64,
            waited_ms = report.waited_ms,
            "registry pushes finished"
        );
        let registry = report.registry.clone();
        self.manifest.registry = Some(report);
        match (result, failed) {
            (Err(e), _) => Err(e),
            (Ok(()), None) => Ok(()),
            (Ok(()), Some(f)) => {
                // The final image is on this engine, but not where the
                // build was asked to keep it.
                self.manifest.ok = false;
                Err(SandboxError::Registry {
                    op: "push",
                    image: registry,
                    message: f,
                }
                .into())
            }
        }
    }
}
