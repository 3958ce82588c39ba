//! The agent of one round, through the shared runner: a container of the
//! round's own (work tree and `.git` writable, only the model endpoint
//! reachable, the CLI's login directory mounted, tied to this process by its
//! lifeline), or the host. The budget kills everything the round started.

use std::path::{Path, PathBuf};
use std::time::Duration;

use belay_agent::cli::ProcessOptions;
use belay_agent::runner::{Call, Runner};
use belay_agent::sandbox::BoxExtras;
use belay_agent::session::EventTarget;
use belay_agent::{AgentKind, AgentReport, AgentSpec, Limits, StopReason};
use belay_record::Redactor;
use belay_sandbox::Mount;

use super::Outcome;
use crate::config::{AgentConfig, PlacementKind};
use crate::events::Usage;
use crate::state::RoundContext;
use crate::supervisor::Supervisor;
use crate::RoundsError;

/// Where the round's own read-only view (the context file) is in a container.
const ROUND_VIEW: &str = "/run/belay-round";

pub(super) struct AgentCall<'a> {
    pub agent: &'a AgentConfig,
    pub round_num: u64,
    pub phase: Option<&'a str>,
    pub prompt: &'a str,
    pub budget_s: f64,
    pub log: &'a Path,
    pub ctx: &'a RoundContext,
    pub fresh_eyes: bool,
    pub max_cost: Option<f64>,
    pub max_turns: Option<u32>,
    /// The round stops when this token is tripped *now* (`Stop::wait_now`).
    pub kill: Option<belay_record::Stop>,
}

pub(super) struct Ran {
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub usage: Usage,
    pub usage_capable: bool,
    pub leftovers: usize,
    pub stop: String,
    pub commands: Vec<String>,
    pub stderr_tail: String,
    /// The work tree may hold a repository the agent made: the sweep of
    /// its container found a nested `.git`, or the round was stopped before
    /// any sweep (a host-placed agent runs on the host anyway).
    pub repos_planted: bool,
}

/// A peer command naming a pinned CLI by its bare name runs the pinned
/// install in a container (the host's script is not runnable there).
fn container_spec(spec: &AgentSpec) -> AgentSpec {
    let mut spec = spec.clone();
    if let AgentKind::Command { program, .. } = &mut spec.kind {
        if matches!(program.as_str(), "claude" | "codex" | "gemini") {
            let pinned = belay_agent::session::agents_dir()
                .join("node_modules/.bin")
                .join(&*program);
            if pinned.exists() {
                *program = pinned.display().to_string();
            }
        }
    }
    spec
}

/// The agent reports its usage (for the no-progress breaker).
fn reports_usage(spec: &AgentSpec) -> bool {
    match &spec.kind {
        AgentKind::Command { program, args } => {
            belay_agent::cli::stream_of(program, args).is_some()
        }
        // Their stdout is the answer: no usage to judge progress by.
        AgentKind::Grok | AgentKind::Antigravity => false,
        AgentKind::Builtin | AgentKind::Codex | AgentKind::Claude | AgentKind::Gemini => true,
    }
}

/// What the runner's output says of the round.
fn ran_of(out: belay_agent::runner::Output, usage_capable: bool) -> Ran {
    let repos_planted = !out.nested_git.is_empty();
    let r = out.report;
    Ran {
        outcome: outcome_of(&r),
        exit_code: r.exit_code,
        usage: Usage {
            input_tokens: r.usage.input_tokens,
            output_tokens: r.usage.output_tokens,
            cached_tokens: r.usage.cached_tokens,
            cost_usd: r.cost_usd,
            turns: r.turns,
        },
        usage_capable,
        leftovers: out.leftovers,
        stop: r.stop.describe(),
        commands: r.commands,
        stderr_tail: r.stderr_tail,
        repos_planted,
    }
}

fn outcome_of(r: &AgentReport) -> Outcome {
    match &r.stop {
        StopReason::WallTime { .. } | StopReason::Idle { .. } => Outcome::TimedOut,
        StopReason::TurnLimit { .. } | StopReason::CostLimit { .. } => Outcome::Limit,
        _ if r.killed_after_result => Outcome::GraceKilled,
        StopReason::Completed if r.exit_code.is_none_or(|c| c == 0) => Outcome::Clean,
        _ => Outcome::Failed,
    }
}

impl Supervisor {
    /// The environment an agent image brings over the work tree (an env
    /// build's image), found once per image.
    async fn agent_env_volumes(
        &self,
        image: &str,
        on_host: bool,
    ) -> Result<belay_sandbox::envimage::EnvVolumes, RoundsError> {
        let Some(rt) = self.rt.as_ref().filter(|_| !on_host) else {
            return Ok(Default::default());
        };
        let mut known = self.env.lock().await;
        if let Some(e) = known.get(image) {
            return Ok(e.agent.clone());
        }
        let e = belay_sandbox::envimage::RunEnv::open(
            rt.as_ref(),
            image,
            self.run.id(),
            belay_agent::sandbox::WORKDIR,
            &self.redactor(),
            false,
        )
        .await?;
        let agent = e.agent.clone();
        known.insert(image.to_string(), e);
        Ok(agent)
    }

    pub(super) async fn run_agent(&self, c: AgentCall<'_>) -> Result<Ran, RoundsError> {
        let cfg = &self.cfg;
        let log_dir = self.log_dir();
        let on_host = c.agent.placement == PlacementKind::Host;
        let spec = if on_host {
            c.agent.spec.clone()
        } else {
            container_spec(&c.agent.spec)
        };
        let (view, context_path) = self.round_view(&c, on_host)?;
        let env = self.agent_env(&c, on_host, &context_path);
        let (mounts, login) = self.agent_mounts(&c, on_host, &view)?;
        // The login tokens the agent can read: scrubbed from its log, its
        // events and every record before it starts.
        self.add_secrets(&super::login::secrets(&c.agent.login_dirs));
        let redactor = self.redactor();
        let env_volumes = self.agent_env_volumes(&c.agent.image, on_host).await?;
        let (run, obs) = (&self.run, &*self.observer);
        let warn = move |m: &str| crate::supervisor::warn_to(run, obs, m);
        let runner = Runner {
            rt: self.rt.clone(),
            image: &c.agent.image,
            on_host,
            auto_approve: c.agent.auto_approve,
            endpoint: self.endpoint.as_ref(),
            client: None,
            prices: &self.prices,
            redactor: &redactor,
            run_id: self.run.id(),
            workdir: self.git.root(),
            git: Some(&self.git),
            records: log_dir.join(".box"),
            warn: &warn,
            extras: BoxExtras {
                git_writable: true,
                mounts,
                lifeline: self.lifeline.as_ref().map(|l| l.path.clone()),
                env: env_volumes,
                ..Default::default()
            },
            agent_env: env,
            boxes: None,
            warm: false,
        };
        let grace = if cfg.runtime.grace_after_result_s > 0.0 {
            cfg.runtime.grace_after_result_s
        } else {
            c.agent.sigterm_grace_s
        };
        let call = self.agent_call(&c, &spec, grace, &redactor);
        let usage_capable = reports_usage(&spec);
        let result = match c.kill {
            Some(k) => {
                tokio::select! {
                    r = runner.run(call) => Some(r),
                    _ = k.wait_now() => None,
                }
            }
            None => Some(runner.run(call).await),
        };
        if let Some(back) = login
            .as_ref()
            .filter(|_| c.agent.login_write_back)
            .map(|l| l.finish())
            .filter(|b| !b.is_empty())
        {
            self.emit(
                Some(&format!("R{}", c.round_num)),
                &crate::events::RoundEvent::LoginCopiedBack {
                    round_num: c.round_num,
                    paths: back,
                },
            );
        }
        let Some(result) = result else {
            // Stopped now: the host group died with the dropped call; the
            // container goes here.
            return Ok(self.stopped_now(on_host, usage_capable).await);
        };
        let out = result?;
        Ok(ran_of(out, usage_capable))
    }

    /// The round's own view dir, with the context file in it for a
    /// container; the view and where the agent finds the context file.
    fn round_view(
        &self,
        c: &AgentCall<'_>,
        on_host: bool,
    ) -> Result<(PathBuf, PathBuf), RoundsError> {
        let log_dir = self.log_dir();
        let view = log_dir.join(".round-view");
        fs_err::create_dir_all(&view).map_err(|e| RoundsError::io("cannot create", &view, e))?;
        let context_path = if on_host {
            log_dir.join(crate::state::CONTEXT_FILE)
        } else {
            Path::new(ROUND_VIEW).join(crate::state::CONTEXT_FILE)
        };
        if !on_host {
            crate::state::write(&view, crate::state::CONTEXT_FILE, c.ctx, &self.redactor())?;
        }
        Ok((view, context_path))
    }

    /// The agent's environment: the round's variables, the config's, the passed ones.
    fn agent_env(
        &self,
        c: &AgentCall<'_>,
        on_host: bool,
        context_path: &Path,
    ) -> Vec<(String, String)> {
        let log_dir = self.log_dir();
        let mut env: Vec<(String, String)> = vec![
            ("AGENT_RUNNER_ROUND_NUM".into(), c.round_num.to_string()),
            (
                "AGENT_RUNNER_LOG_DIR".into(),
                if on_host {
                    log_dir.display().to_string()
                } else {
                    ROUND_VIEW.into()
                },
            ),
            (
                "AGENT_RUNNER_CONTEXT_FILE".into(),
                context_path.display().to_string(),
            ),
            (
                "AGENT_RUNNER_REAP_GRACE_S".into(),
                format!("{}", c.agent.sigterm_grace_s),
            ),
        ];
        if let Some(p) = c.phase {
            env.push(("AGENT_RUNNER_PHASE".into(), p.to_string()));
        }
        if c.fresh_eyes {
            env.push(("AGENT_RUNNER_FRESH_EYES".into(), "1".into()));
        }
        env.extend(c.agent.env.iter().cloned());
        for name in &c.agent.pass_env {
            if let Some((k, v)) = self.passed_env.iter().find(|(k, _)| k == name) {
                env.push((k.clone(), v.clone()));
            }
        }
        env
    }

    /// The agent's mounts (the round view; in a container, the read-only
    /// config and prompts and the login copies) and the login copies' view.
    fn agent_mounts(
        &self,
        c: &AgentCall<'_>,
        on_host: bool,
        view: &Path,
    ) -> Result<(Vec<Mount>, Option<super::login::LoginView>), RoundsError> {
        let log_dir = self.log_dir();
        let mut mounts = vec![Mount {
            host: view.to_path_buf(),
            container: ROUND_VIEW.into(),
            read_only: true,
        }];
        if !on_host {
            // The config and prompts in the tree: read-only to the agent.
            let views = self.trust.readonly_views(
                &self.cfg,
                self.git.root(),
                &log_dir.join(".control-view"),
            )?;
            mounts.extend(views.into_iter().map(|(host, rel)| Mount {
                host,
                container: format!("{}/{rel}", belay_agent::sandbox::WORKDIR),
                read_only: true,
            }));
        }
        let login = if on_host {
            None
        } else {
            let (m, view) = super::login::prepare(&c.agent.login_dirs, &log_dir.join(".login"))?;
            mounts.extend(m);
            Some(view)
        };
        Ok((mounts, login))
    }

    /// The runner's call for the round's agent.
    fn agent_call<'s>(
        &self,
        c: &AgentCall<'s>,
        spec: &'s AgentSpec,
        grace: f64,
        redactor: &Redactor,
    ) -> Call<'s> {
        let log_dir = self.log_dir();
        let step = format!("R{}", c.round_num);
        Call {
            spec,
            kind: "rounds-agent".into(),
            prompt: c.prompt,
            limits: Limits {
                max_turns: c.max_turns,
                max_cost_usd: c.max_cost,
                wall_time: Some(Duration::from_secs_f64(c.budget_s)),
                idle: None,
                final_grace: Duration::from_secs_f64(grace),
            },
            events: Some(EventTarget {
                sink: self.run.sink().clone(),
                step: Some(step),
                source: "agent",
            }),
            logs: log_dir.join(".agent"),
            pid_file: Some(log_dir.join("agent.pid")),
            process: ProcessOptions {
                transcript: Some((c.log.to_path_buf(), redactor.clone())),
                final_marker: c.agent.terminal_marker.clone(),
                tie_to_parent: true,
            },
            prepared: None,
        }
    }

    /// A round stopped now: its containers removed, a host agent's
    /// leftovers killed; what it ran is recorded as killed.
    async fn stopped_now(&self, on_host: bool, usage_capable: bool) -> Ran {
        // The dropped call's box was not closed: its containers, its route
        // network and the sweep of the work tree, as for every mode.
        let (run, obs) = (&self.run, &*self.observer);
        let warn = move |m: &str| crate::supervisor::warn_to(run, obs, m);
        belay_agent::runner::after_stop(self.rt.as_deref(), self.run.id(), self.git.root(), &warn)
            .await;
        self.remove_round_containers().await;
        let leftovers = if on_host {
            tokio::task::spawn_blocking(belay_agent::orphans::kill_adopted)
                .await
                .map(|k| k.len())
                .unwrap_or(0)
        } else {
            0
        };
        Ran {
            outcome: Outcome::Killed,
            exit_code: None,
            usage: Usage {
                input_tokens: 0,
                output_tokens: 0,
                cached_tokens: 0,
                cost_usd: 0.0,
                turns: 0,
            },
            usage_capable,
            leftovers,
            stop: "killed".into(),
            commands: vec![],
            stderr_tail: String::new(),
            repos_planted: !on_host,
        }
    }

    /// Remove this project's round containers (after a round stopped now,
    /// or left by a killed belay whose lifeline went).
    pub async fn remove_round_containers(&self) {
        let Some(rt) = &self.rt else { return };
        let filter = format!("{}={}", belay_sandbox::labels::RUN, self.run.id());
        if let Ok(list) = rt.list_containers(&[filter]).await {
            for c in list {
                let _ = rt.remove(&c.id).await;
            }
        }
    }
}
