//! The build container as the run uses it: the base image (built, pulled or
//! the default), containers started from a checkpoint (pulled first when only
//! the registry has it) with the run's environment, the repository copy, and
//! the containers left at the end. [`super::pool::ContainerPool`] keeps them.

use super::*;

impl Run<'_> {
    /// The base image the build starts from, made present on this engine.
    pub(super) async fn resolve_base(&mut self) -> Result<String, EnvError> {
        match &self.opts.base {
            BaseSpec::Image(img) => {
                if !self.rt.image_exists(img).await? && !self.pull_shared_base(img).await? {
                    return Err(SandboxError::ImageMissing {
                        image: img.clone(),
                        hint: "belay pulls no images from Docker Hub: build or load it first (`docker images` lists what is there), push it to the --registry given, or use --base-dockerfile".into(),
                    }
                    .into());
                }
                Ok(img.clone())
            }
            BaseSpec::Default => {
                // A Python project whose requires-python (or version hints)
                // leaves out bookworm's Python gets the suite that has one.
                let choice = crate::base_suite::choose(self.ctx.python.as_ref())?;
                let image = choice.image();
                self.phase(
                    "base",
                    format!("{image} (Python {}): {}", choice.python, choice.reason),
                );
                self.manifest.base_suite = Some(choice.clone());
                if !self.rt.image_exists(&image).await? && !self.pull_shared_base(&image).await? {
                    if image == DEFAULT_BASE_IMAGE {
                        return Err(SandboxError::ImageMissing {
                            image: DEFAULT_BASE_IMAGE.into(),
                            hint: "It is belay's default base image, built offline from your apt mirror: run `belay image bootstrap` (about a minute), or pass --base-image / --base-dockerfile".into(),
                        }
                        .into());
                    }
                    // Another suite's base is made the way `belay image
                    // bootstrap --suite <suite>` makes it.
                    self.phase(
                        "base",
                        format!(
                            "{image} is missing: building it as `belay image bootstrap --suite {}` does",
                            choice.suite
                        ),
                    );
                    let req = belay_sandbox::bootstrap::ImageRequest {
                        suite: choice.suite.clone(),
                        tag: image.clone(),
                        include: Vec::new(),
                        mirror: None,
                        work_dir: self.dir.root.join(format!("bootstrap-{}", choice.suite)),
                    };
                    let obs = self.obs;
                    belay_sandbox::bootstrap::build_image(self.rt, &req, &|m: &str| {
                        obs.event(&BuildEvent::Phase {
                            name: "base".into(),
                            detail: m.to_string(),
                        })
                    })
                    .await?;
                }
                Ok(image)
            }
            BaseSpec::Dockerfile(df) => {
                let df = df.canonicalize().map_err(|e| {
                    EnvError::Usage(format!(
                        "--base-dockerfile {}: {e}. Pass the path of an existing Dockerfile",
                        df.display()
                    ))
                })?;
                let context = df
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."));
                let tag = self.store.base_name();
                let attempt = self.records.next_attempt("docker_build", "docker_build");
                let log_path = self.dir.log_path("docker_build", "docker_build", attempt);
                self.phase("base image", format!("building {} as {tag}", df.display()));
                let t0 = Instant::now();
                let mut lbl = BTreeMap::new();
                lbl.insert(labels::BELAY.to_string(), "true".to_string());
                lbl.insert(labels::RUN.to_string(), self.dir.run_id.clone());
                lbl.insert(labels::KIND.to_string(), "base".to_string());
                let res = self
                    .rt
                    .build(
                        &BuildRequest {
                            dockerfile: df.clone(),
                            context_dir: context.clone(),
                            tag: tag.clone(),
                            labels: lbl,
                            timeout: self.opts.docker_build_timeout,
                            log_path: log_path.clone(),
                            network: Network::Bridge,
                        },
                        &self.redactor,
                    )
                    .await;
                let (code, err) = match &res {
                    Ok(_) => (Some(0), String::new()),
                    Err(e) => (None, e.to_string()),
                };
                self.record(Execution {
                    block_id: "docker_build".into(),
                    phase: "docker_build".into(),
                    attempt,
                    exit_code: code,
                    timed_out: matches!(res, Err(SandboxError::BuildTimeout { .. })),
                    stdout_tail: String::new(),
                    stderr_tail: err,
                    checkpoint_before: None,
                    checkpoint_after: res.as_ref().ok().map(|_| tag.clone()),
                    repair_command: None,
                    duration_s: round3(t0.elapsed().as_secs_f64()),
                    command: format!("docker build -f {} {}", df.display(), context.display()),
                    log_path: Some(log_path),
                    started_at: belay_record::now_rfc3339(),
                })?;
                res?;
                Ok(tag)
            }
        }
    }

    /// The environment containers are created with (and checkpoints keep):
    /// CA variables and HOME, never proxy credentials (see [`HostTrust::container_env`]).
    pub(crate) fn container_env(&self) -> Vec<(String, String)> {
        let mut env = self.trust.ca_env();
        env.push(("HOME".into(), "/root".into()));
        env
    }

    /// The base image is missing on this engine: pull it from the registry
    /// (see [`CheckpointStore::pull_shared_base`]). `Ok(false)`: no registry,
    /// or it does not have it either.
    async fn pull_shared_base(&mut self, image: &str) -> Result<bool, EnvError> {
        let Some(remote) = self.store.pull_shared_base(image).await? else {
            return Ok(false);
        };
        self.phase("base", format!("{image} pulled from {remote}"));
        Ok(true)
    }

    /// Make a checkpoint that is only in the registry present on this engine
    /// (see [`CheckpointStore::ensure_local`]).
    pub(super) async fn ensure_local(&mut self, image_ref: &str) -> Result<(), EnvError> {
        if self.store.ensure_local(image_ref).await? {
            self.phase("registry", format!("pulled {image_ref}"));
        }
        Ok(())
    }

    /// A fresh container of `image` (present on this engine first) as the
    /// build container, with the run's network, environment and mounts.
    pub(crate) async fn start_container(&mut self, image: &str) -> Result<(), EnvError> {
        self.ensure_local(image).await?;
        let spec = ContainerSpec {
            image: image.to_string(),
            run_id: self.dir.run_id.clone(),
            kind: "env-build".into(),
            network: self.opts.network,
            env: self.container_env(),
            working_dir: Some(REPO_DIR.to_string()),
            // Kept containers are the user's: the reaper must leave them alone.
            unowned: self.opts.keep_container,
            mounts: self
                .package_caches
                .as_ref()
                .map(|c| c.mounts())
                .unwrap_or_default(),
            ..Default::default()
        };
        self.pool
            .start(&spec, &self.dir.containers(), &self.redactor)
            .await
    }

    /// A fresh container holding the repository copy and the trust files.
    pub(crate) async fn start_workspace_container(&mut self, image: &str) -> Result<(), EnvError> {
        self.start_base_container(image).await?;
        self.copy_workspace_in().await
    }

    /// A fresh container with the trust files, without the repository.
    pub(crate) async fn start_base_container(&mut self, image: &str) -> Result<(), EnvError> {
        self.start_container(image).await?;
        let container = self.pool.id().unwrap_or_default().to_string();
        let files = self.trust.container_files();
        if !files.is_empty() {
            self.rt.put_files(&container, &files).await?;
        }
        Ok(())
    }

    /// Copy the repository into the current container.
    pub(crate) async fn copy_workspace_in(&mut self) -> Result<(), EnvError> {
        let container = self.pool.id().map(str::to_string).ok_or_else(|| {
            EnvError::Usage("no build container to copy the repository into".into())
        })?;
        let filter = TarFilter {
            exclude: self.excluded.iter().map(PathBuf::from).collect(),
            ignore: None,
        };
        self.rt
            .copy_dir_in(&container, &self.repo, REPO_DIR, &filter)
            .await?;
        Ok(())
    }

    /// Make sure a container holding `image` is running.
    pub(super) async fn ensure_container(&mut self, image: &str) -> Result<(), EnvError> {
        if self.pool.id().is_none() {
            self.start_container(image).await?;
        }
        Ok(())
    }

    /// The end of the build's containers: all removed in the background and
    /// waited for, except, with `--keep-container`, one with the final state
    /// (or the failed block's state).
    pub(super) async fn release_containers(&mut self) {
        self.pool.drain_retired();
        if self.opts.keep_container {
            // Keep a container with the final state (or the failed block's state).
            if self.pool.id().is_none() {
                if let Some(img) = self.manifest.final_image.clone() {
                    let _ = self.start_container(&img).await;
                }
            }
            if let Some(c) = self.pool.id() {
                self.obs.event(&BuildEvent::Phase {
                    name: "container".into(),
                    detail: format!(
                        "kept {} (remove it with `docker rm -f`)",
                        &c[..c.len().min(12)]
                    ),
                });
            }
            self.pool.drain_retired();
        } else {
            self.pool.remove_current();
        }
        self.pool.await_removals().await;
    }
}
