//! The build container: the base image (built, pulled or the default), the
//! container of the current checkpoint, and its environment.

use super::*;

impl Run<'_> {
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
                let tag = format!("{}:{}-base", self.opts.image_prefix, self.dir.run_id);
                let attempt = self.next_attempt("docker_build", "docker_build");
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

    pub(crate) async fn start_container(&mut self, image: &str) -> Result<(), EnvError> {
        self.ensure_local(image).await?;
        if let Some(old) = self.container.take() {
            self.retired.push(old);
        }
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
        let id = self.rt.create(&spec).await?;
        self.container_image_size = self.rt.image(image).await?.map(|i| i.size);
        for old in self.retired.drain(..) {
            self.removals.push(self.rt.remove_detached(&old));
        }
        let mut log = JsonlAppender::open(&self.dir.containers())?;
        log.append(
            &serde_json::json!({"container": id, "image": image, "created_at": belay_record::now_rfc3339(), "pid": std::process::id()}),
            &self.redactor,
        )?;
        self.container = Some(id);
        Ok(())
    }

    /// A fresh container holding the repository copy and the trust files.
    pub(crate) async fn start_workspace_container(&mut self, image: &str) -> Result<(), EnvError> {
        self.start_base_container(image).await?;
        self.copy_workspace_in().await
    }

    /// A fresh container with the trust files, without the repository.
    pub(crate) async fn start_base_container(&mut self, image: &str) -> Result<(), EnvError> {
        self.start_container(image).await?;
        let container = self.container.clone().unwrap_or_default();
        let files = self.trust.container_files();
        if !files.is_empty() {
            self.rt.put_files(&container, &files).await?;
        }
        Ok(())
    }

    /// Copy the repository into the current container.
    pub(crate) async fn copy_workspace_in(&mut self) -> Result<(), EnvError> {
        let container = self.container.clone().ok_or_else(|| {
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

    /// The retired container's work is checkpointed: it goes away in the background.
    pub(crate) fn retire_container(&mut self) {
        if let Some(c) = self.container.take() {
            self.retired.push(c);
        }
    }

    /// Make sure a container holding `image` is running.
    pub(super) async fn ensure_container(&mut self, image: &str) -> Result<(), EnvError> {
        if self.container.is_none() {
            self.start_container(image).await?;
        }
        Ok(())
    }
}
