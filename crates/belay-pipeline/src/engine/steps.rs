//! Running one step: command steps, agent steps through the one agent service, and
//! the context and verdict of an agent.

use super::*;

impl Engine<'_> {
    pub(super) async fn run_step(
        &mut self,
        step: &Step,
        n: u64,
    ) -> Result<StepResult, PipelineError> {
        self.hygiene(step)?;
        match &step.kind {
            StepKind::Command { command } => {
                if let Some(r) = self.setup(step, n).await? {
                    return Ok(r);
                }
                let (code, timed_out, out) = self
                    .exec(
                        step,
                        n,
                        "command",
                        command,
                        step.network,
                        step.workspace,
                        step.timeout_s.map(Duration::from_secs),
                    )
                    .await?;
                let verdict = if code == 0 && !timed_out {
                    Verdict::Pass
                } else {
                    Verdict::Fail
                };
                let detail = if timed_out {
                    format!("timed out after {}s\n{out}", step.timeout_s.unwrap_or(0))
                } else {
                    out
                };
                Ok(StepResult {
                    verdict,
                    detail,
                    exit_code: Some(code),
                    missing_deps: vec![],
                })
            }
            StepKind::Action { action } if action == "commit" => self.commit(step).await,
            StepKind::Action { .. } => {
                let script = step
                    .params
                    .get("script")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default();
                let cmd = self.render(script, step);
                let (code, timed_out, out) = self
                    .exec(
                        step,
                        n,
                        "action",
                        &cmd,
                        step.network,
                        step.workspace,
                        step.timeout_s.map(Duration::from_secs),
                    )
                    .await?;
                Ok(StepResult {
                    verdict: if code == 0 && !timed_out {
                        Verdict::Pass
                    } else {
                        Verdict::Fail
                    },
                    detail: out,
                    exit_code: Some(code),
                    missing_deps: vec![],
                })
            }
            StepKind::Agent { agent } => self.agent(step, agent, n).await,
        }
    }

    /// `{subject}`, `{pipeline}`, `{run_id}` and `{<param>}` in a template.
    pub(super) fn render(&self, template: &str, step: &Step) -> String {
        let subject = step
            .params
            .get("subject")
            .and_then(|v| v.as_str())
            .map(String::from)
            .unwrap_or_else(|| self.p.name.clone());
        let mut out = template
            .replace("{subject}", &subject)
            .replace("{pipeline}", &self.p.name)
            .replace("{run_id}", &self.state.run_id);
        for (k, v) in &step.params {
            if let Some(s) = v.as_str() {
                out = out.replace(&format!("{{{k}}}"), s);
            }
        }
        out
    }

    pub(super) fn context(&self, step: &Step, prompt: &str) -> String {
        let mut s = prompt.to_string();
        s.push_str(&format!(
            "\n\n## Task context\nPipeline `{}`, step `{}`, attempt {} of {}. The workspace is {WORKDIR}; your changes there are kept. You cannot commit (git is read-only for you): the pipeline commits once every gate passes.\n",
            self.p.name, step.name, self.state.attempt, self.state.max_attempts
        ));
        s.push_str(&format!("Artifacts (summaries, findings, reports) go in {ARTIFACTS}, outside the worktree: the earlier steps' are there to read.\n"));
        if !step.produces.is_empty() {
            let files: Vec<String> = step
                .produces
                .iter()
                .map(|f| format!("{ARTIFACTS}/{f}"))
                .collect();
            s.push_str(&format!(
                "Write these files: {} (your final answer becomes {} if you write none).\n",
                files.join(", "),
                files[0]
            ));
        }
        if let (Some(a), Some(v)) = (&step.artifact, &step.verdicts) {
            let a = format!("{ARTIFACTS}/{a}");
            let mut choices = format!("`VERDICT: {}` or `VERDICT: {}`", v.pass, v.fail);
            if let Some(u) = &v.unverifiable {
                choices.push_str(&format!(" (or `VERDICT: {u}` when it cannot be checked)"));
            }
            s.push_str(&format!(
                "Write your findings to `{a}`, ending with one line {choices}.\n"
            ));
        }
        s.push_str("\n## Dependency policy\n");
        match self.p.deps_policy {
            DepsPolicy::Locked => s.push_str(&format!(
                "You may only use dependencies already present in {}. If the work needs a dependency that is not there, declare it in your final answer under the header `## Missing dependencies` (one `name==version` per line), finish what you can, and do not add it to any manifest.\n",
                self.p.lockfiles.join(", ")
            )),
            DepsPolicy::Open => s.push_str("You may add dependencies as exact pins in the project's manifest; never run a package manager's `add` command.\n"),
        }
        let root = self.git.root();
        let pipeline_dir = fs_err::canonicalize(&self.p.dir).unwrap_or_else(|_| self.p.dir.clone());
        let prefix = pipeline_dir
            .strip_prefix(root)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for f in &self.p.additional_files {
            // Read through hostfs: a step may have swapped the file for a link.
            let rel = prefix.join(f).to_string_lossy().into_owned();
            if let Ok(Some(bytes)) = belay_sandbox::hostfs::read(root, &rel, 4 * SHARED_MAX as u64)
            {
                let text = self
                    .redactor
                    .redact(&String::from_utf8_lossy(&bytes))
                    .into_owned();
                s.push_str(&format!(
                    "\n## Shared file: {f}\n```\n{}\n```\n",
                    tail(&text, SHARED_MAX)
                ));
            }
        }
        if let Some(fb) = &self.state.feedback {
            s.push_str(&format!("\n## Previous attempt feedback\n{fb}\n"));
        }
        s
    }

    /// An agent step, through the one agent service: the built-in agent or a
    /// CLI, in the step's container (a CLI's network limited to the model
    /// endpoint), belay's limits, its events in the log as they happen.
    pub(super) async fn agent(
        &mut self,
        step: &Step,
        agent: &str,
        n: u64,
    ) -> Result<StepResult, PipelineError> {
        let def = self
            .p
            .agents
            .get(agent)
            .cloned()
            .ok_or_else(|| PipelineError::Config(format!("agent `{agent}` is not loaded")))?;
        let mut spec = agent_spec(&def)?;
        let task = self.context(step, &def.prompt);
        let (placement, endpoint, prices, final_grace) = if spec.is_builtin() {
            if self.model.is_none() {
                return Err(PipelineError::Config(format!("step `{}` runs agent `{agent}`, which needs the pipeline's `llm` block (model, base_url, api_key_env)", step.name)));
            }
            let net = if step.network {
                Net::Open(step.egress.kind())
            } else {
                Net::None
            };
            let c = self.container(net, step.workspace, step).await?;
            let placement = Placement::Container {
                ended_by_owner: false,
                rt: self.rt.clone(),
                id: c,
                workdir: WORKDIR.into(),
                env: self.step_env(step),
                host_root: (step.workspace == Access::Rw).then(|| self.git.root().to_path_buf()),
                host_dirs: vec![(ARTIFACTS.to_string(), self.artifacts_dir())],
            };
            (placement, None, None, Duration::from_secs(5))
        } else {
            let llm = self.p.llm.clone().ok_or_else(|| {
                PipelineError::Config(format!(
                    "agent `{}` needs the pipeline's `llm` block",
                    def.name
                ))
            })?;
            spec.model.get_or_insert_with(|| llm.model.clone());
            let key = self.model_key.clone();
            let base = self.model_route().await?.url.clone();
            let c = self.container(Net::Model, step.workspace, step).await?;
            let endpoint = Endpoint {
                base_url: base,
                // Unset, each CLI is given the dialect it speaks.
                api: llm
                    .api
                    .or_else(|| spec.kind.native_dialect())
                    .unwrap_or(Api::Responses),
                key: key.map(belay_model::Secret::new),
            };
            let prices = PriceTable::builtin().lookup(spec.model.as_deref().unwrap_or(""));
            let placement = Placement::Container {
                ended_by_owner: false,
                rt: self.rt.clone(),
                id: c,
                workdir: WORKDIR.into(),
                env: self.step_env(step),
                host_root: None,
                host_dirs: vec![],
            };
            (placement, Some(endpoint), prices, Duration::from_secs(10))
        };
        let client = self.model.clone();
        let session = AgentSession {
            spec,
            placement,
            limits: belay_agent::Limits {
                // Uncapped unless the step caps it, as agentic-dev-loop:
                // the step's wall time (and cost, when priced) bound it.
                max_turns: Some(step.max_iterations.unwrap_or(u32::MAX)),
                wall_time: step.timeout_s.map(Duration::from_secs),
                final_grace,
                ..belay_agent::Limits::default()
            },
            client: client.as_ref(),
            builtin: BuiltinConfig {
                instructions: Some(format!(
                    "You are the `{}` agent of a gated pipeline.",
                    def.name
                )),
                scrub: if self.p.llm.as_ref().is_none_or(|l| l.scrub_requests) {
                    self.redactor.clone()
                } else {
                    Redactor::default()
                },
                ..BuiltinConfig::default()
            },
            endpoint,
            prices,
            // The container is the sandbox: the CLI's own approvals would only stall it.
            auto_approve: true,
            logs: self
                .run
                .path(LOGS_DIR)
                .join(format!("{n:04}-{}-tools", sanitize(&step.name))),
            redactor: self.redactor.clone(),
            events: Some(EventTarget {
                sink: self.run.sink().clone(),
                step: Some(step.name.clone()),
                source: Kind::Agent.source(),
            }),
            pid_file: None,
            process: Default::default(),
        };
        let report = session
            .run(&task)
            .await
            .map_err(|source| PipelineError::Agent {
                agent: format!("{} ({})", def.name, def.runner),
                source,
            })?;
        self.event(
            Some(&step.name),
            PipelineEvent::AgentReport {
                runner: def.runner.clone(),
                stop: report.stop.clone(),
                turns: report.turns,
                usage: report.usage,
                cost_usd: report.cost_usd,
                files_changed: report.files_changed.clone(),
                exit_code: report.exit_code,
                final_text: tail(&report.final_text, 4096),
                stderr_tail: tail(&report.stderr_tail, 2048),
            },
        )?;
        if let belay_agent::StopReason::Infra { message } = &report.stop {
            // Not the agent's failure and not a gate's: the machine's. No
            // retry (it would fail the same way), exit 3.
            return Err(PipelineError::SandboxFailed(format!(
                "agent step `{}`: the container engine failed under the agent ({message}). No command can run in the step's container, so the run stopped without retrying; check the engine (`docker info`, `docker system df`, the daemon's log), then `--resume {}`",
                step.name, self.state.run_id
            )));
        }
        // Before the verdict is read: whatever the step left running (a
        // process its code under test started) is ended, so nothing can
        // rewrite the artifact between the agent's end and belay's read.
        self.kill_leftovers(&step.name).await?;
        self.agent_result(step, &report)
    }

    /// An agent step's verdict: its artifact's, or whether it finished.
    pub(super) fn agent_result(
        &mut self,
        step: &Step,
        report: &belay_agent::AgentReport,
    ) -> Result<StepResult, PipelineError> {
        let u = &report.usage;
        self.tokens += u.input_tokens + u.output_tokens;
        self.cost_usd += report.cost_usd;
        let missing = if self.p.deps_policy == DepsPolicy::Locked {
            missing_deps(&report.final_text)
        } else {
            vec![]
        };
        // What the agent wrote in the workspace (an older prompt's habit) is
        // moved to the artifacts first; then its answer fills a missing summary.
        self.collect_outputs(step)?;
        self.capture_summary(step, &report.final_text)?;
        if let (Some(a), Some(v)) = (&step.artifact, &step.verdicts) {
            return Ok(match self.read_artifact(a) {
                Some(text) => {
                    // Redacted before it is cut, so no secret is split.
                    let (verdict, why) = verdict::read(&text, v);
                    StepResult {
                        verdict,
                        detail: format!("{why}\n\n{}:\n{}", a, tail(&text, FEEDBACK_MAX)),
                        exit_code: None,
                        missing_deps: missing,
                    }
                }
                None => StepResult {
                    verdict: Verdict::Retry,
                    detail: format!(
                        "the agent wrote no readable {a} (stop: {})",
                        report.stop.describe()
                    ),
                    exit_code: None,
                    missing_deps: missing,
                },
            });
        }
        let verdict = if report.ok() {
            Verdict::Pass
        } else {
            Verdict::Fail
        };
        Ok(StepResult {
            verdict,
            detail: format!(
                "the agent stopped: {}\n{}",
                report.stop.describe(),
                tail(&report.final_text, 2048)
            ),
            exit_code: None,
            missing_deps: missing,
        })
    }
}
