//! One agent call: the plan file written from belay's state, the agent in a
//! container of its own (or on the host, the opt-out), its limits, and after
//! it the judging of what it changed in the plan file.
//!
//! A container per call means nothing an agent starts outlives its call: no
//! process left behind can edit the plan file after belay has judged it, or
//! the code after belay has committed it. The reviewer's container sees the
//! plan file read-only (belay's own copy mounted over the tree's): neither it
//! nor the code under review it may run can write it, and a change found
//! after a review anyway is tampering, never a transition.

use std::time::Duration;

use belay_agent::sandbox::BoxExtras;
use belay_agent::session::EventTarget;
use belay_agent::{AgentSpec, Limits};

use super::Engine;
use crate::events::PlanEvent;
use crate::gate::{self, Judgement, Role};
use crate::PlanError;

/// What one call gave.
pub(super) struct CallOutcome {
    /// Why the call does not count (a non-zero exit, a limit), if it does not.
    pub failure: Option<String>,
    pub judgement: Judgement,
    /// What to tell the agent next time (reverted changes).
    pub feedback: Vec<String>,
    /// The agent's own final message, when it ended well (not belay's
    /// interim report): where a reviewer's verdict is read.
    pub answer: Option<String>,
}

/// A box opening in the background.
pub(super) type PreparedBox =
    tokio::task::JoinHandle<Result<belay_agent::sandbox::AgentBox, belay_agent::AgentError>>;

/// Close a box that was opening in the background, once it has opened.
pub(super) async fn close_opening(h: Option<PreparedBox>) {
    let Some(h) = h else { return };
    if let Ok(Ok(b)) = h.await {
        let _ = b.close().await;
    }
}

/// A role's agent: the flag (also `agent@model`), then the plan's
/// `models`, then the CLI's own default.
pub(super) fn role_spec(
    o: &super::RunOptions,
    plan: &crate::schema::Plan,
    role: Role,
) -> AgentSpec {
    let (spec, flag, planned) = match role {
        Role::Developer => (&o.developer, &o.developer_model, &plan.developer_model),
        Role::Reviewer => (&o.reviewer, &o.reviewer_model, &plan.reviewer_model),
    };
    let mut spec = spec.clone();
    spec.model = flag.clone().or(spec.model).or_else(|| planned.clone());
    spec
}

/// A role's environment set: the developer's is writable; the reviewer
/// gets the read-only set no agent ever wrote, so that a program the
/// developer planted on the environment's PATH (a `setsid`, a `node`) does
/// not run in the reviewer's container and speak for it.
pub(super) fn env_extras(env: &belay_sandbox::envimage::RunEnv, role: Role) -> BoxExtras {
    match role {
        Role::Developer => BoxExtras {
            env: env.agent.clone(),
            ..BoxExtras::default()
        },
        Role::Reviewer => BoxExtras {
            env: env.gate.clone(),
            env_read_only: true,
            ..BoxExtras::default()
        },
    }
}

/// Open a role's box in the background, as the runner would open it for
/// the role's call (which takes it instead of opening its own).
#[allow(clippy::too_many_arguments)]
pub(super) fn open_in_background(
    o: &super::RunOptions,
    role: Role,
    rt: std::sync::Arc<dyn belay_sandbox::ContainerRuntime>,
    spec: AgentSpec,
    extras: BoxExtras,
    git: belay_vcs::Git,
    run_id: String,
    records: std::path::PathBuf,
) -> PreparedBox {
    let image = o.image.clone();
    let endpoint = match role {
        Role::Developer => o.developer_endpoint.as_ref(),
        Role::Reviewer => o.reviewer_endpoint.as_ref(),
    };
    let model_url = endpoint.map(|e| e.base_url.clone());
    tokio::spawn(async move {
        belay_agent::sandbox::AgentBox::open(belay_agent::sandbox::BoxSpec {
            rt,
            image,
            run_id,
            kind: format!("plan-{}", role.as_str()),
            repo: git.root().to_path_buf(),
            git: Some(&git),
            records,
            agent: &spec,
            model_url,
            network: extras.network,
            keep: extras.keep,
            extras,
        })
        .await
    })
}

impl Engine<'_> {
    /// Start opening the reviewer's next box in the background, after the
    /// developer's call, while belay commits and gates: a fresh box per
    /// review, as always, only started early. Its read-only plan view is
    /// checked before the review uses it. Not while the gate's environment
    /// volumes may still be empty: the engine fills a new volume from the
    /// image when a container first mounts it, and two containers filling
    /// one at once (the gate's and this one) could show the gate half of it.
    pub(super) async fn prepare_reviewer(&mut self) -> Result<(), PlanError> {
        // One from before (the checkpoint went back to the developer, whose
        // call may have detached its plan view): a new one instead.
        close_opening(self.prepared_reviewer.take()).await;
        let volumes_filled = self.env.gate.volumes.is_empty() || self.gated;
        if self.o.on_host || !volumes_filled {
            return Ok(());
        }
        let Some(rt) = self.o.rt.clone() else {
            return Ok(());
        };
        let extras = self.box_extras(Role::Reviewer)?;
        let spec = self.spec_for(Role::Reviewer);
        self.prepared_reviewer = Some(open_in_background(
            self.o,
            Role::Reviewer,
            rt,
            spec,
            extras,
            self.git.clone(),
            self.state.run_id.clone(),
            self.run.path("box"),
        ));
        Ok(())
    }

    /// The prepared reviewer's box, when it opened and its plan view is
    /// still mounted (a rename of the plan file in the work tree, by the
    /// gate's code, detaches it: then a new box).
    async fn take_prepared_reviewer(&mut self) -> Option<belay_agent::sandbox::AgentBox> {
        let b = self.prepared_reviewer.take()?.await.ok()?.ok()?;
        let rt = self.o.rt.clone()?;
        let view = format!("{}/{}", belay_agent::sandbox::WORKDIR, self.plan_rel);
        if rt.mount_attached(b.id(), &view).await {
            Some(b)
        } else {
            tracing::debug!("the reviewer's prepared box lost its plan view; a new box");
            let _ = b.close().await;
            None
        }
    }

    /// The developer's box opened during the run's setup, if it opened.
    async fn take_prepared_developer(&mut self) -> Option<belay_agent::sandbox::AgentBox> {
        self.prepared_developer.take()?.await.ok()?.ok()
    }

    /// Close the prepared boxes no call used.
    pub(super) async fn close_prepared(&mut self) {
        close_opening(self.prepared_reviewer.take()).await;
        close_opening(self.prepared_developer.take()).await;
    }

    fn spec_for(&self, role: Role) -> AgentSpec {
        role_spec(self.o, &self.plan, role)
    }

    pub(super) async fn call(
        &mut self,
        role: Role,
        id: &str,
        run_kind: &'static str,
        prompt: &str,
    ) -> Result<CallOutcome, PlanError> {
        let before = self.write_plan()?;
        let extras = self.box_extras(role)?;
        let spec = self.spec_for(role);
        let budget = self
            .o
            .max_cost_usd
            .map(|m| (m - self.state.cost_usd).max(0.0));
        if budget.is_some_and(|b| b <= 0.0) {
            return Err(PlanError::Refused(format!(
                "the run's cost budget (--max-cost ${:.2}) is spent: ${:.4} so far",
                self.o.max_cost_usd.unwrap_or_default(),
                self.state.cost_usd
            )));
        }
        let trace = |action: &'static str| PlanEvent::AgentTrace {
            action,
            checkpoint: id.into(),
            agent: spec.to_string(),
            role: role.as_str(),
            run_kind,
            timeout_s: None,
            prompt: None,
            outcome: None,
            exit_code: None,
            answer: None,
            cost_usd: None,
            duration_s: None,
        };
        let mut start = trace("start");
        if let PlanEvent::AgentTrace { timeout_s, .. } = &mut start {
            *timeout_s = Some(self.o.timeout.as_secs_f64());
        }
        self.emit(Some(id), &start)?;
        let mut shown = trace("prompt");
        if let PlanEvent::AgentTrace { prompt: p, .. } = &mut shown {
            *p = Some(self.o.audit.prepare(prompt));
        }
        self.emit(Some(id), &shown)?;
        let n = self.state.agent_calls + 1;
        let logs = self
            .run
            .path("agents")
            .join(format!("{n:03}-{id}-{}", role.as_str()));
        let limits = Limits {
            max_turns: self.o.max_turns,
            max_cost_usd: budget,
            wall_time: Some(self.o.timeout),
            idle: self.o.idle,
            final_grace: Duration::from_secs(5),
        };
        let events = self.o.audit.streams_agent_events().then(|| EventTarget {
            sink: self.run.sink().clone(),
            step: Some(id.to_string()),
            source: "agent",
        });
        let prepared = match role {
            Role::Reviewer => self.take_prepared_reviewer().await,
            Role::Developer => self.take_prepared_developer().await,
        };
        let (run, obs) = (&self.run, &*self.o.observer);
        let warn = move |m: &str| super::warn_to(run, obs, m.to_string());
        let runner = belay_agent::runner::Runner {
            rt: self.o.rt.clone(),
            image: &self.o.image,
            on_host: self.o.on_host,
            auto_approve: self.o.auto_approve,
            endpoint: match role {
                Role::Developer => self.o.developer_endpoint.as_ref(),
                Role::Reviewer => self.o.reviewer_endpoint.as_ref(),
            },
            client: self.o.client.as_ref(),
            prices: &self.o.prices,
            redactor: self.run.redactor(),
            run_id: &self.state.run_id,
            workdir: self.git.root(),
            git: Some(&self.git),
            records: self.run.path("box"),
            warn: &warn,
            extras,
            agent_env: vec![],
            // The developer's container is kept for its next call. The
            // reviewer's is not: its read-only plan view is a file mount
            // over the plan file, which the next write of the plan file
            // (a rename in the work tree) would leave it without. It is
            // removed in the background, its processes ended first.
            boxes: Some(&*self.warm),
            warm: role == Role::Developer,
        };
        let result = runner
            .run(belay_agent::runner::Call {
                spec: &spec,
                kind: format!("plan-{}", role.as_str()),
                prompt,
                limits,
                events,
                logs,
                pid_file: Some(self.run.path("agent.pid")),
                process: Default::default(),
                prepared,
            })
            .await;
        let result = match result {
            Ok(out) => {
                if out.leftovers > 0 {
                    self.emit(
                        Some(id),
                        &PlanEvent::LeftoversKilled {
                            checkpoint: id.into(),
                            count: out.leftovers,
                        },
                    )?;
                }
                Ok(out.report)
            }
            Err(e) => Err(e),
        };
        self.state.agent_calls = n;
        let (failure, finish, answer) = self.finished(result, trace("finish"), role)?;
        self.emit(Some(id), &finish)?;
        let (judgement, feedback) = self.judge_plan_file(&before, role, id)?;
        Ok(CallOutcome {
            failure,
            judgement,
            feedback,
            answer,
        })
    }

    /// What a call's result means: why it does not count (if it does not),
    /// the finish trace (`finish`, filled in), and the agent's own answer
    /// (when it ended well; an interim report belay built is none). A CLI
    /// that is not there, or a spec that cannot run, is the user's to fix:
    /// an error, the run stops.
    fn finished(
        &mut self,
        result: Result<belay_agent::AgentReport, belay_agent::AgentError>,
        mut finish: PlanEvent,
        role: Role,
    ) -> Result<(Option<String>, PlanEvent, Option<String>), PlanError> {
        let (failure, answer) = match result {
            Ok(report) => {
                self.state.cost_usd += report.cost_usd;
                self.state.tokens += report.usage.input_tokens + report.usage.output_tokens;
                if let PlanEvent::AgentTrace {
                    outcome,
                    exit_code,
                    answer,
                    cost_usd,
                    duration_s,
                    ..
                } = &mut finish
                {
                    *outcome = Some(report.stop.describe());
                    *exit_code = report.exit_code;
                    *answer = Some(self.o.audit.prepare(&report.final_text));
                    *cost_usd = Some(report.cost_usd);
                    *duration_s = Some(report.duration_s);
                }
                let failure = (!report.ok()).then(|| {
                    format!(
                        "the {} {}{}",
                        role.as_str(),
                        report.stop.describe(),
                        report
                            .exit_code
                            .map(|c| format!(" (exit {c})"))
                            .unwrap_or_default()
                    )
                });
                let answer = (report.ok() && !report.interim).then_some(report.final_text);
                (failure, answer)
            }
            Err(
                e @ (belay_agent::AgentError::Spawn { .. } | belay_agent::AgentError::Config(_)),
            ) => return Err(e.into()),
            Err(e) => {
                if let PlanEvent::AgentTrace { outcome, .. } = &mut finish {
                    *outcome = Some(format!("error: {e}"));
                }
                (Some(format!("the {} failed: {e}", role.as_str())), None)
            }
        };
        if let PlanEvent::AgentTrace { outcome, .. } = &mut finish {
            if failure.is_none() && outcome.is_none() {
                *outcome = Some("completed".into());
            }
        }
        Ok((failure, finish, answer))
    }

    /// What the reviewer's box adds to the default: the plan file mounted
    /// read-only over the tree's, from belay's own copy, so that neither the
    /// reviewer nor the code it runs (`verify_in_review`) can write it. The
    /// developer proposes through the file, so its box has none; on the host
    /// there are no mounts (the opt-out), and what changed is judged after.
    fn box_extras(&self, role: Role) -> Result<BoxExtras, PlanError> {
        let env = env_extras(&self.env, role);
        if role != Role::Reviewer || self.o.on_host {
            return Ok(env);
        }
        let view = self.run.path(super::PLAN_VIEW);
        let text = self.plan.render(&self.state.view());
        // Rewritten in place, not renamed over: the reviewer's kept container
        // has this very file (its inode) mounted. No agent runs meanwhile,
        // and no agent can write it (belay's run directory, mounted read-only).
        fs_err::write(&view, text.as_bytes()).map_err(|e| PlanError::io("write", &view, e))?;
        Ok(BoxExtras {
            mounts: vec![belay_sandbox::Mount {
                host: view,
                container: format!("{}/{}", belay_agent::sandbox::WORKDIR, self.plan_rel),
                read_only: true,
            }],
            ..env
        })
    }

    /// After a call: what the agent proposed in the plan file, judged against
    /// `before` (what belay wrote); the rest reverted and recorded. The file
    /// is written again from the state and the state saved.
    ///
    /// For the reviewer every change is tampering (the file is belay's while
    /// code under review runs): recorded as `plan_tampered`, never taken.
    fn judge_plan_file(
        &self,
        before: &serde_json::Value,
        role: Role,
        id: &str,
    ) -> Result<(Judgement, Vec<String>), PlanError> {
        let after = belay_sandbox::hostfs::read(
            self.git.root(),
            &self.plan_rel,
            crate::schema::MAX_PLAN_BYTES,
        )
        .ok()
        .flatten();
        let mut judgement = gate::judge(before, after.as_deref(), role, id);
        // The notes go into prompts, the plan file and its commits: no
        // secret's value with them.
        if let Some(n) = judgement.notes.take() {
            judgement.notes = Some(self.run.redactor().redact(&n).into_owned());
        }
        let mut feedback = Vec::new();
        if !judgement.violations.is_empty() {
            let recorded: Vec<crate::gate::Violation> = judgement
                .violations
                .iter()
                .map(|v| crate::gate::Violation {
                    field: v.field.clone(),
                    what: self.o.audit.prepare(&v.what),
                })
                .collect();
            match role {
                Role::Developer => {
                    self.emit(
                        Some(id),
                        &PlanEvent::ChangeReverted {
                            checkpoint: id.into(),
                            role: role.as_str(),
                            violations: recorded,
                        },
                    )?;
                    for v in &judgement.violations {
                        feedback.push(format!(
                            "belay reverted your change to {}: {}",
                            v.field, v.what
                        ));
                    }
                }
                Role::Reviewer => {
                    self.emit(
                        Some(id),
                        &PlanEvent::PlanTampered {
                            checkpoint: id.into(),
                            role: role.as_str(),
                            violations: recorded,
                        },
                    )?;
                }
            }
        }
        self.write_plan()?;
        self.save()?;
        Ok((judgement, feedback))
    }

    /// The reviewer decides; it does not write code. Whatever it changed
    /// besides the plan file is put back as the built commit has it, and
    /// what it added that the ignore rules hide (`ignored_before`: what was
    /// there before its call) is removed.
    pub(super) async fn revert_reviewer_edits(
        &mut self,
        id: &str,
        ignored_before: Option<&[String]>,
    ) -> Result<(), PlanError> {
        let mut changed: Vec<String> = self
            .git
            .dirty(&[])
            .await?
            .into_iter()
            .filter(|p| p != &self.plan_rel)
            .collect();
        if !changed.is_empty() {
            let keep = format!(":(exclude,literal){}", self.plan_rel);
            self.git.restore_from_head(&[".", &keep]).await?;
            // -ff: a planted repository goes too.
            self.git.run(&["clean", "-ffdq", "--", ".", &keep]).await?;
        }
        if let Some(before) = ignored_before {
            // Every file now; `before` may have collapsed a large directory
            // to `dir/`, which then covers its files.
            let before_set: std::collections::HashSet<&str> =
                before.iter().map(String::as_str).collect();
            let collapsed: Vec<&String> = before.iter().filter(|b| b.ends_with('/')).collect();
            let planted: Vec<String> = self
                .git
                .ignored_entries(false)
                .await?
                .into_iter()
                .filter(|p| {
                    p != &self.plan_rel
                        && !before_set.contains(p.as_str())
                        && !collapsed.iter().any(|b| p.starts_with(b.as_str()))
                })
                .collect();
            for p in &planted {
                self.remove_in_tree(p)?;
                self.remove_empty_parents(p);
            }
            changed.extend(planted);
        }
        if changed.is_empty() {
            return Ok(());
        }
        self.emit(
            Some(id),
            &PlanEvent::ReviewerEditsReverted {
                checkpoint: id.into(),
                paths: changed.iter().take(50).cloned().collect(),
                count: changed.len(),
            },
        )?;
        Ok(())
    }
}
