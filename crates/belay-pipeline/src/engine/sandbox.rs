//! The sandbox side of a run: step containers per policy, their networks (the open
//! bridge, the egress and model routes), environment volumes, execs, setup, and the
//! end of every step (processes, git control files, outputs, set-id bits, the
//! artifacts' secrets).

use super::*;
use belay_sandbox::envimage::EnvVolumes;

impl Engine<'_> {
    /// End the step in every container of the run: kill every process it
    /// left (a background job must not outlive its step and read the next
    /// step's secrets or touch the tree after its gates), by pid namespace and
    /// recorded identity, never by name; and empty `/tmp` (the steps' `HOME`)
    /// and `/dev/shm`.
    pub(super) async fn end_step_processes(&mut self, step: &str) -> Result<(), PipelineError> {
        self.kill_leftovers(step).await?;
        // A step runs as root: a set-id file it left would be a root shell
        // for anyone on the host.
        let root = self.git.root().to_path_buf();
        let swept = belay_sandbox::hostfs::sweep_workspace(&root).map_err(|e| {
            PipelineError::Infra(format!("cannot check the workspace for set-id files after step `{step}`: {e}. belay walks the whole workspace as root after every step; a path it cannot open stops the run. Remove that path, then resume the run"))
        })?;
        self.nested_git = swept.nested_git;
        let mut setid = swept.setid_cleared;
        // The other directories steps write that live on the host: the run's
        // artifacts and the caches.
        let mut others = vec![self.artifacts_dir()];
        others.extend(self.p.caches.iter().map(|c| self.cache_dir(c)));
        for dir in others.into_iter().filter(|d| d.is_dir()) {
            let swept = belay_sandbox::hostfs::sweep_workspace(&dir).map_err(|e| {
                PipelineError::Infra(format!("cannot check {} for set-id files after step `{step}`: {e}. Remove that path, then resume the run", dir.display()))
            })?;
            setid.extend(
                swept
                    .setid_cleared
                    .into_iter()
                    .map(|f| format!("{}/{f}", dir.display())),
            );
        }
        if !setid.is_empty() {
            self.event(
                Some(step),
                PipelineEvent::SetidCleared {
                    paths: cap_list(&setid).to_vec(),
                },
            )?;
        }
        // Whatever the step left in the artifacts directory, declared or not,
        // loses its secrets (the declared outputs are scrubbed again once
        // collected).
        self.scrub_artifacts_dir(step)?;
        if self.p.isolation.allow_git_mutations {
            // Both run, whatever the first finds: each undoes a plant.
            let quarantined = self.quarantine_new_submodules(step).await;
            let checked = self.check_git_control(step);
            quarantined?;
            checked?;
        }
        Ok(())
    }

    /// Kill every process the step left in the run's containers (not the
    /// sweeps of the step's end: those follow in [`Self::end_step_processes`]).
    pub(super) async fn kill_leftovers(&mut self, step: &str) -> Result<(), PipelineError> {
        let containers: Vec<String> = self.containers.values().cloned().collect();
        let mut killed = 0;
        for c in containers {
            killed += self.rt.end_step(&c).await?;
        }
        if killed > 0 {
            self.event(Some(step), PipelineEvent::ProcessesEnded { killed })?;
        }
        Ok(())
    }

    /// With git mutations allowed, a step may commit a submodule: the
    /// repository at its path (which the step made) is moved aside, since
    /// its config would run on the user's next `git status`; the run stops.
    async fn quarantine_new_submodules(&mut self, step: &str) -> Result<(), PipelineError> {
        // No nested repository in the workspace (the sweep above lists
        // them): nothing to move aside, and no git to run.
        if self.nested_git.is_empty() {
            return Ok(());
        }
        let before =
            (!self.state.head_at_start.is_empty()).then(|| self.state.head_at_start.clone());
        let links = self
            .git
            .gitlinks_added(before.as_deref())
            .await
            .map_err(|e| PipelineError::Failed(format!(
                "step `{step}` left repositories in the workspace ({}), and belay cannot list the submodules it committed ({e}); one could run its config on your next git status. Remove those repositories, then start a new run",
                self.nested_git.join(", ")
            )))?;
        let submodules = &self.state.submodules_at_start;
        let root = self.git.root().to_path_buf();
        let mut moved = Vec::new();
        let mut failed = Vec::new();
        for rel in links.iter().filter(|l| !submodules.contains(l)) {
            match belay_sandbox::hostfs::quarantine_git(&root, rel) {
                Ok(Some(to)) => moved.push(to),
                Ok(None) => {}
                Err(e) => failed.push(format!("{rel}: {e}")),
            }
        }
        if moved.is_empty() && failed.is_empty() {
            return Ok(());
        }
        self.event(
            Some(step),
            PipelineEvent::GitTampered {
                quarantined: Some(moved.clone()),
                not_moved: Some(failed.clone()),
                repaired: None,
                links_removed: None,
                modes_cleared: None,
                specials_removed: None,
                files: None,
            },
        )?;
        if !failed.is_empty() {
            return Err(PipelineError::Failed(format!(
                "step `{step}` committed submodules whose repositories would run their config on your next git status, and belay could not move these aside: {}. Remove their .git before you run git in the workspace, then start a new run",
                failed.join("; ")
            )));
        }
        Err(PipelineError::Failed(format!(
            "step `{step}` committed submodules whose repositories would run their config on your next git status; moved aside: {}. Check the repository, then start a new run",
            moved.join(", ")
        )))
    }

    /// With git mutations allowed, a step may commit, but not redirect git
    /// or plant what the user's next git runs: a planted or changed hook,
    /// guarded file, link, worktree or replace ref is put back (removed when
    /// it was absent) and recorded; a changed `commondir`, `config.worktree`
    /// or alternates file is put back and stops the run.
    pub(super) fn check_git_control(&mut self, step: &str) -> Result<(), PipelineError> {
        if self.state.git_control_at_start.is_empty() {
            self.state.git_control_at_start = self.git.control_files();
            return Ok(());
        }
        // The redirecting files first (they stop the run), then the rest.
        let changed = self
            .git
            .restore_control_files(&self.state.git_control_at_start);
        // Hooks, guarded files, planted links, worktrees and replace refs:
        // put back as they were at the start (the user's next git would run
        // a planted hook), recorded; the run goes on, as a round does.
        if let Some(g) = &self.state.git_guard {
            let r = g.restore().map_err(|e| {
                PipelineError::Failed(format!(
                    "step `{step}` left the git dir {} in a state belay cannot check ({e}); no host git ran on it. Check the repository, then start a new run",
                    self.git.git_dir().display()
                ))
            })?;
            if !r.is_empty() {
                self.event(
                    Some(step),
                    PipelineEvent::GitTampered {
                        quarantined: None,
                        not_moved: None,
                        repaired: Some(r.restored),
                        links_removed: Some(r.links_removed),
                        modes_cleared: Some(r.modes_cleared),
                        specials_removed: Some(r.specials_removed),
                        files: None,
                    },
                )?;
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        self.event(
            Some(step),
            PipelineEvent::GitTampered {
                quarantined: None,
                not_moved: None,
                repaired: None,
                links_removed: None,
                modes_cleared: None,
                specials_removed: None,
                files: Some(changed.clone()),
            },
        )?;
        Err(PipelineError::Failed(format!(
            "step `{step}` changed git's control files ({}) in {}: they redirect git to another config, whose commands the next host git would run. Planted files were removed; check the repository, then start a new run",
            changed.join(", "),
            self.git.git_dir().display()
        )))
    }

    /// The run's bridge for `network: true` (made on first use): NAT to the
    /// outside like the default bridge, but fenced so that nothing on the
    /// host itself (a database on all addresses, the engine's swarm ports)
    /// is reachable from it.
    pub(super) async fn open_network(&mut self) -> Result<String, PipelineError> {
        if let Some((net, _)) = &self.open_net {
            return Ok(net.clone());
        }
        let net = format!("belay-{}-open", self.state.run_id);
        let info = self.rt.ensure_network(&net, false).await?;
        let bridge = info.bridge.as_deref().ok_or_else(|| {
            PipelineError::Infra(format!("network {net} has no bridge interface belay can fence: remove it (`docker network rm {net}`) and rerun"))
        })?;
        let gw: std::net::IpAddr = info.gateway.parse().map_err(|_| {
            PipelineError::Infra(format!(
                "network {net} has no usable gateway ({}): remove it and rerun",
                info.gateway
            ))
        })?;
        // A network with a route out: only the host is refused.
        let fence = belay_sandbox::firewall::Firewall::lock(
            bridge,
            gw,
            &[],
            belay_sandbox::firewall::Forwarded::Pass,
        )?;
        self.event(
            None,
            PipelineEvent::OpenNetwork {
                network: net.clone(),
                firewall: fence.chain().to_string(),
            },
        )?;
        self.open_net = Some((net.clone(), fence));
        Ok(net)
    }

    /// The internal network and the proxy on it for a kind of egress
    /// (started on first use): (network name, proxy URL).
    pub(super) async fn egress_proxy(
        &mut self,
        kind: OpenNet,
    ) -> Result<(String, String), PipelineError> {
        if let Some((_, r)) = self.egress.iter().find(|(k, _)| *k == kind) {
            return Ok((r.network.clone(), r.url.clone()));
        }
        let (net, allow, presets) = match kind {
            OpenNet::Browser => (
                format!("belay-{}-browser", self.state.run_id),
                belay_sandbox::egress::Allow::public_web(),
                vec![],
            ),
            _ => (
                format!("belay-{}-egress", self.state.run_id),
                belay_sandbox::egress::package_registries(),
                vec!["package-registries".to_string()],
            ),
        };
        let route =
            belay_sandbox::route::egress_route(self.rt.as_ref(), &net, allow.clone()).await?;
        self.event(
            None,
            PipelineEvent::EgressProxy {
                network: net.clone(),
                proxy: route.url.clone(),
                class: kind,
                presets,
                allowed_hosts: allow.hosts.clone(),
                allowed_ports: allow.ports.clone(),
                any_public_host: allow.public,
                firewall: route.firewall_chain().to_string(),
            },
        )?;
        let out = (route.network.clone(), route.url.clone());
        self.egress.push((kind, route));
        Ok(out)
    }

    /// The route from an agent CLI's container to the model endpoint (made on
    /// first use): an internal network, and on the host either a TCP forwarder
    /// to a loopback endpoint or a proxy that allows only the endpoint's host.
    pub(super) async fn model_route(&mut self) -> Result<&NetRoute, PipelineError> {
        if self.model_route.is_none() {
            let llm = self.p.llm.clone().ok_or_else(|| {
                PipelineError::Config(
                    "agent CLIs need the pipeline's `llm` block (model, base_url)".into(),
                )
            })?;
            let api = llm.api.unwrap_or(Api::Responses);
            let base = llm
                .base_url
                .clone()
                .unwrap_or_else(|| ClientConfig::default_base_url(api).to_string());
            let net = format!("belay-{}-model", self.state.run_id);
            let route = belay_sandbox::route::model_route(self.rt.as_ref(), &net, &base).await?;
            let host = belay_sandbox::egress::url_host(&base);
            self.event(
                None,
                PipelineEvent::ModelRoute {
                    network: route.network.clone(),
                    base_url_in_container: route.url.clone(),
                    endpoint_host: host,
                },
            )?;
            self.model_route = Some(route);
        }
        self.model_route
            .as_ref()
            .ok_or_else(|| PipelineError::Infra("no model route".into()))
    }

    /// The image's build-environment directories under the workspace path
    /// (an image from `belay env build` has its venv there), found once per
    /// run, as this run's volumes.
    pub(super) async fn env_volumes(&mut self) -> Result<EnvVolumes, PipelineError> {
        if let Some(v) = &self.env_volumes {
            return Ok(v.clone());
        }
        // Only an env build's image brings an environment: no probe else.
        if !belay_sandbox::envimage::is_env_image(self.rt.as_ref(), &self.image).await? {
            self.env_volumes = Some(EnvVolumes::default());
            return Ok(EnvVolumes::default());
        }
        let dirs = belay_sandbox::envimage::probe(
            self.rt.as_ref(),
            &self.image,
            &self.state.run_id,
            WORKDIR,
            Some(&belay_sandbox::envimage::probe_cache()),
            &self.redactor,
        )
        .await?;
        let volumes = EnvVolumes::for_run(&dirs, &self.state.run_id, "step");
        if !volumes.is_empty() {
            let image = self.image.clone();
            self.event(
                None,
                PipelineEvent::EnvVolumes {
                    dirs: volumes.dirs(),
                    image,
                },
            )?;
        }
        self.env_volumes = Some(volumes.clone());
        Ok(volumes)
    }

    pub(super) async fn container(
        &mut self,
        net: Net,
        access: Access,
        step: &Step,
    ) -> Result<String, PipelineError> {
        let mut held = step.secrets.clone();
        held.sort();
        let key = (net, access, held.join(","));
        if let Some(c) = self.containers.get(&key) {
            return Ok(c.clone());
        }
        let network = matches!(net, Net::Open(_));
        let root = self.git.root().to_path_buf();
        let env_volumes = self.env_volumes().await?;
        let mut mounts = self.step_mounts(&root, access, &env_volumes).await?;
        // The host's own `.venv` (a developer's, for local tests) is not the
        // sandbox's: steps get an empty one in its place, so they can neither
        // run the host's interpreter nor write into it. An image's own
        // `.venv` (an env volume) is not the host's.
        let mut tmpfs = vec!["/tmp".to_string()];
        // (Not following a link a step may have put there.)
        let host_venv = fs_err::symlink_metadata(root.join(".venv")).is_ok_and(|m| m.is_dir());
        if host_venv && !env_volumes.dirs().iter().any(|d| d == ".venv") {
            tmpfs.push(format!("{WORKDIR}/.venv"));
        }
        let trust = belay_sandbox::trust::HostTrust::detect();
        let mut env = vec![
            ("HOME".to_string(), "/tmp".to_string()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        env.extend(env_volumes.env(WORKDIR));
        if let Some(src) = &trust.ca_source {
            mounts.push(Mount {
                host: src.clone(),
                container: "/etc/belay/ca-certificates.crt".into(),
                read_only: true,
            });
            env.extend(trust.ca_env());
        }
        let network_name = self
            .container_network(net, &trust, &mut env, &mut mounts)
            .await?;
        let seccomp = self.step_seccomp()?;
        let spec = ContainerSpec {
            image: self.image.clone(),
            run_id: self.state.run_id.clone(),
            kind: "pipeline".into(),
            network: if network {
                Network::Bridge
            } else {
                Network::None
            },
            env,
            working_dir: Some(WORKDIR.into()),
            mounts,
            read_only_rootfs: true,
            drop_capabilities: true,
            memory_bytes: self.p.isolation.memory.as_deref().and_then(parse_memory),
            pids_limit: self.p.isolation.pids,
            nano_cpus: self.p.isolation.cpus.map(|c| (c * 1e9) as i64),
            tmpfs,
            seccomp_profile: seccomp,
            network_name,
            // Behind a proxy, names are the proxy's to resolve.
            refuse_dns: matches!(
                net,
                Net::Model | Net::Open(OpenNet::Registries | OpenNet::Browser)
            ),
            idle_user: Some(IDLE_USER.into()),
            ..Default::default()
        };
        let id = self.rt.create(&spec).await?;
        let net_desc = match net {
            Net::None => "none",
            Net::Open(OpenNet::Bridge) => "run bridge, host fenced off",
            Net::Open(OpenNet::Registries) => "internal + egress proxy (package registries)",
            Net::Open(OpenNet::Browser) => "internal + egress proxy (any public host, logged)",
            Net::Model => "internal, model endpoint only",
        };
        let memory = spec
            .memory_bytes
            .unwrap_or_else(belay_sandbox::default_memory);
        let pids = spec.pids_limit.unwrap_or(belay_sandbox::DEFAULT_PIDS);
        let sandbox = PipelineEvent::Sandbox {
            container: id.clone(),
            network: net_desc,
            workspace: access,
            image: self.image.clone(),
            read_only_rootfs: true,
            cap_drop: "ALL",
            git_mutations: self.p.isolation.allow_git_mutations,
            memory_bytes: memory,
            pids_limit: pids,
            secrets: key.2.clone(),
            seccomp: self.seccomp.as_ref().map(|s| s.2.clone()),
        };
        self.event(None, sandbox)?;
        self.containers.insert(key, id.clone());
        Ok(id)
    }

    /// A step container's mounts: workspace, artifacts, env volumes, `.git` and its config, caches.
    async fn step_mounts(
        &mut self,
        root: &Path,
        access: Access,
        env_volumes: &EnvVolumes,
    ) -> Result<Vec<Mount>, PipelineError> {
        let artifacts = self.artifacts_dir();
        let mut mounts = vec![
            Mount {
                host: root.to_path_buf(),
                container: WORKDIR.into(),
                read_only: access == Access::Ro,
            },
            Mount {
                host: artifacts,
                container: ARTIFACTS.into(),
                read_only: false,
            },
        ];
        mounts.extend(env_volumes.mounts(WORKDIR, access == Access::Ro));
        let dot_git = root.join(".git");
        if dot_git.is_file() && !self.p.isolation.allow_git_mutations {
            // A worktree's or submodule's `.git` is a file naming the real
            // git dir: read-only too, so a step cannot swap in a repository
            // of its own (whose config the next host `git status` would run).
            mounts.push(Mount {
                host: dot_git.clone(),
                container: format!("{WORKDIR}/.git"),
                read_only: true,
            });
        }
        if dot_git.is_dir() {
            if !self.p.isolation.allow_git_mutations {
                // Agents read history; they cannot change it.
                mounts.push(Mount {
                    host: root.join(".git"),
                    container: format!("{WORKDIR}/.git"),
                    read_only: true,
                });
            }
            // The config they see has no credentials, and is never theirs
            // to change (a planted fsmonitor or filter stays in the copy).
            let view = self.run.path("git-config.sandbox");
            if !view.exists() {
                self.git.write_sanitized_config(&view).await?;
            }
            mounts.push(Mount {
                host: view,
                container: format!("{WORKDIR}/.git/config"),
                read_only: true,
            });
        }
        for c in &self.p.caches {
            let host = self.cache_dir(c);
            fs_err::create_dir_all(&host).map_err(|e| {
                PipelineError::Config(format!(
                    "cannot create the cache {}: {e}; check that the state directory is writable",
                    host.display()
                ))
            })?;
            let container = match c.in_workspace() {
                Some(rel) => format!("{WORKDIR}/{rel}"),
                None => c.path.clone(),
            };
            mounts.push(Mount {
                host,
                container,
                read_only: false,
            });
        }
        Ok(mounts)
    }

    /// The network a step container joins for `net`; what it needs goes to `env` and `mounts`.
    async fn container_network(
        &mut self,
        net: Net,
        trust: &belay_sandbox::trust::HostTrust,
        env: &mut Vec<(String, String)>,
        mounts: &mut Vec<Mount>,
    ) -> Result<Option<String>, PipelineError> {
        let network = matches!(net, Net::Open(_));
        let mut network_name = None;
        if net == Net::Model {
            let route = self.model_route().await?;
            env.extend(route.env.iter().cloned());
            env.push(("CODEX_HOME".into(), "/tmp/.codex".into()));
            network_name = Some(route.network.clone());
            // The CLIs every agent of the pipeline runs, read-only.
            for def in self.p.agents.values() {
                for m in belay_agent::session::container_mounts(&agent_spec(def)?)
                    .map_err(|e| PipelineError::Config(format!("agent `{}`: {e}", def.name)))?
                {
                    if !mounts.iter().any(|x| x.container == m.container) {
                        mounts.push(m);
                    }
                }
            }
        } else if let Net::Open(kind @ (OpenNet::Registries | OpenNet::Browser)) = net {
            let (name, proxy_url) = self.egress_proxy(kind).await?;
            for k in [
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "http_proxy",
                "https_proxy",
                "ALL_PROXY",
            ] {
                env.push((k.to_string(), proxy_url.clone()));
            }
            env.push(("NO_PROXY".into(), String::new()));
            network_name = Some(name);
        } else if network {
            env.extend(trust.proxy_env.iter().cloned());
            network_name = Some(self.open_network().await?);
        }
        Ok(network_name)
    }

    /// The seccomp profile text for a step container, refused if its file changed since the start.
    fn step_seccomp(&self) -> Result<Option<String>, PipelineError> {
        Ok(match &self.seccomp {
            Some((_, text, _))
                if self
                    .p
                    .isolation
                    .seccomp_profile
                    .as_ref()
                    .is_some_and(|f| f.starts_with(belay_sandbox::seccomp::PREFIX)) =>
            {
                Some(text.clone())
            }
            Some((path, text, hash)) => {
                // Read once at the start; a change since is a step's doing.
                let now = read_policy(path, self.git.root())
                    .map(|b| hex::encode(Sha256::digest(b.as_bytes())))
                    .unwrap_or_default();
                if now != *hash {
                    return Err(PipelineError::Failed(format!(
                        "isolation.seccomp_profile {} changed during the run (a step rewrote it); belay keeps the profile read at the start and refuses to go on. Restore it (git checkout -- {}) and start a new run",
                        path.display(),
                        path.display()
                    )));
                }
                Some(text.clone())
            }
            None => None,
        })
    }

    /// A cache's host directory: `<state_dir>/caches/<name>`.
    pub(super) fn cache_dir(&self, c: &crate::schema::Cache) -> PathBuf {
        let name = c
            .name
            .clone()
            .unwrap_or_else(|| sanitize(c.path.trim_start_matches('/')));
        self.state_dir.join("caches").join(name)
    }

    /// The cap of a step log (`isolation.log_limit`).
    pub(super) fn log_limit(&self) -> Option<u64> {
        self.p.isolation.log_limit.as_deref().and_then(parse_size)
    }

    pub(super) fn step_env(&self, step: &Step) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = step
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        env.push(("BELAY_ARTIFACTS".into(), ARTIFACTS.into()));
        if matches!(step.kind, crate::schema::StepKind::Agent { .. }) {
            env.extend(belay_agent::sandbox::quiet_cli_env());
        }
        for r in &step.secrets {
            if let (Some(def), Some(v)) = (self.p.secrets.get(r), self.secrets.get(r)) {
                env.push((def.key.clone(), v.clone()));
            }
        }
        env
    }

    /// Run a shell command in a step container; (exit code, timed out, log tail).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn exec(
        &mut self,
        step: &Step,
        n: u64,
        what: &str,
        command: &str,
        network: bool,
        access: Access,
        timeout: Option<Duration>,
    ) -> Result<(i64, bool, String), PipelineError> {
        let c = self
            .container(
                if network {
                    Net::Open(step.egress.kind())
                } else {
                    Net::None
                },
                access,
                step,
            )
            .await?;
        let log = self
            .run
            .path(LOGS_DIR)
            .join(format!("{n:04}-{}-{what}.log", sanitize(&step.name)));
        let spec = ExecSpec {
            argv: vec!["bash".into(), "-c".into(), command.to_string()],
            working_dir: Some(WORKDIR.into()),
            env: self.step_env(step),
            timeout,
            log_path: log.clone(),
            log_limit: self.log_limit(),
        };
        let out = self
            .rt
            .exec(&c, &spec, &self.redactor, &NoopObserver)
            .await?;
        // Only the tail is read: a step's log can be gigabytes.
        let text = read_tail(&log, FEEDBACK_MAX as u64)
            .unwrap_or_else(|| format!("{}{}", out.stdout_tail, out.stderr_tail));
        self.event(
            Some(&step.name),
            PipelineEvent::Command {
                what: what.to_string(),
                command: command.to_string(),
                exit_code: out.exit_code,
                timed_out: out.timed_out,
                duration_s: (out.duration.as_secs_f64() * 1000.0).round() / 1000.0,
                log,
            },
        )?;
        Ok((out.exit_code, out.timed_out, tail(&text, FEEDBACK_MAX)))
    }

    pub(super) async fn setup(
        &mut self,
        step: &Step,
        n: u64,
    ) -> Result<Option<StepResult>, PipelineError> {
        let Some(setup) = step.setup.clone() else {
            return Ok(None);
        };
        let key = hex::encode(Sha256::digest(
            format!("{}\n{}\n{}", self.image, step.name, setup).as_bytes(),
        ));
        let stamp =
            self.state_dir
                .join("stamps")
                .join(format!("{}-{}", sanitize(&step.name), &key[..16]));
        if stamp.exists() && !self.refresh {
            self.event(Some(&step.name), PipelineEvent::SetupCached { stamp })?;
            return Ok(None);
        }
        // Setup provisions (installs): it gets the network, and the step's
        // secrets only when the step says so (a networked install is where a
        // secret would leak).
        let mut provision = step.clone();
        if !step.setup_secrets {
            provision.secrets.clear();
        }
        let (code, timed_out, out) = self
            .exec(
                &provision,
                n,
                "setup",
                &setup,
                true,
                Access::Rw,
                step.timeout_s.map(Duration::from_secs),
            )
            .await?;
        if code != 0 || timed_out {
            return Ok(Some(StepResult {
                verdict: Verdict::Fail,
                detail: format!("setup failed:\n{out}"),
                exit_code: Some(code),
                missing_deps: vec![],
            }));
        }
        fs_err::create_dir_all(stamp.parent().unwrap_or(&self.state_dir))
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        belay_record::atomic_write(&stamp, setup.as_bytes())?;
        Ok(None)
    }
}
