//! A job's agent session, through the shared runner: a fresh session (never
//! resumed) in a container of its own with only the job's worktrees mounted
//! writable, `.git` read-only and only the model endpoint reachable (or on
//! the host, the opt-out), under the job's iteration limit. A stop request
//! (SIGTERM) ends it at once.

use std::time::Duration;

use crate::events::JobRun;
use belay_agent::cli::ProcessOptions;
use belay_agent::runner::{Call, Runner};
use belay_agent::sandbox::BoxExtras;
use belay_agent::session::EventTarget;
use belay_agent::{AgentReport, AgentSpec, Limits};
use belay_sandbox::Mount;

use super::repos::{container_path, Workspace};
use crate::config::Placement;
use crate::events::JobEvent;
use crate::job::Job;
use crate::services::Services;
use crate::worker::Stop;
use crate::JobsError;

/// The agent a job runs: its `agent` spec, else its `runtime`, else the
/// config's; its `model` wins over the spec's.
pub fn spec_for(svc: &Services, job: &Job) -> Result<AgentSpec, JobsError> {
    let s = match (&job.agent, job.runtime.as_deref()) {
        (Some(a), _) => a.clone(),
        (None, Some("openrouter")) => "builtin".to_string(),
        (None, Some(r)) => r.to_string(),
        (None, None) => svc.cfg.agent.spec.clone(),
    };
    let mut spec: AgentSpec = s
        .parse()
        .map_err(|e| JobsError::Refused(format!("job {}: {e}", job.id)))?;
    if let Some(m) = &job.model {
        spec.model = Some(m.clone());
    }
    // A job's own agent may not speak the config's endpoint: refused before
    // its work tree is made.
    if let Some(e) = &svc.endpoint {
        spec.check_dialect("job", e.api, &e.base_url, |native| {
            format!("give this job an agent that speaks it, or point [agent] model_url at a `{native}` endpoint with model_api = \"{native}\"")
        })
        .map_err(|e| JobsError::Refused(format!("job {}: {e}", job.id)))?;
    }
    Ok(spec)
}

/// How a session ended.
pub enum Session {
    Done(Box<AgentReport>),
    /// Stopped by the worker's shutdown.
    Stopped,
}

/// The job's environment sets, when its agent or its checks run in a
/// container: the image's environment directories over the worktree.
pub async fn run_env(
    svc: &Services,
    run: &JobRun,
    ws: &Workspace,
) -> Result<belay_sandbox::envimage::RunEnv, JobsError> {
    let checks = ws.repos.iter().any(|r| !r.cfg.checks.is_empty());
    let in_container = svc.cfg.agent.placement != Placement::Host || checks;
    let Some(rt) = svc.rt.as_ref().filter(|_| in_container) else {
        return Ok(Default::default());
    };
    let env = belay_sandbox::envimage::RunEnv::open(
        rt.as_ref(),
        &svc.cfg.agent.image,
        run.id(),
        belay_agent::sandbox::WORKDIR,
        run.redactor(),
        checks,
    )
    .await?;
    // A check the image cannot run would fail after the agent's whole
    // session: refused before it, with the way to an image that has it.
    for r in &ws.repos {
        for c in &r.cfg.checks {
            if let Some(prog) = env.lacking(c) {
                return Err(JobsError::Refused(format!(
                    "`{}`'s check `{c}` runs `{prog}`, which the image {} does not have: build the repository's environment with `belay env build --repo {}` (its jobs then run in it), or set [agent] image to one that has {prog}",
                    r.cfg.name,
                    env.image,
                    r.cfg.path.display()
                )));
            }
        }
    }
    if !env.dirs().is_empty() {
        let _ = run.emit(
            "jobs",
            None,
            &JobEvent::Sandbox {
                image: svc.cfg.agent.image.clone(),
                env_dirs: env.dirs(),
            },
        );
    }
    Ok(env)
}

/// One session on the workspace.
#[allow(clippy::too_many_arguments)]
pub async fn session(
    svc: &Services,
    run: &JobRun,
    ws: &Workspace,
    spec: &AgentSpec,
    attempt: &'static str,
    prompt: &str,
    max_turns: u32,
    stop: &Stop,
) -> Result<Session, JobsError> {
    let Some(first) = ws.repos.first() else {
        return Err(JobsError::Refused("the job has no repository".into()));
    };
    let on_host = svc.cfg.agent.placement == Placement::Host;
    let mut mounts = Vec::new();
    if !on_host {
        for (i, r) in ws.repos.iter().enumerate().skip(1) {
            let at = container_path(i, &r.cfg.name);
            mounts.push(Mount {
                host: r.wt_path.clone(),
                container: at.clone(),
                read_only: false,
            });
            mounts.push(Mount {
                host: r.wt_path.join(".git"),
                container: format!("{at}/.git"),
                read_only: true,
            });
        }
    }
    let warn = |m: &str| run.warn(m.to_string());
    let mut env = svc.passed_env.clone();
    env.push(("BELAY_JOB_ID".into(), ws.state.job_id.clone()));
    let runner = Runner {
        rt: svc.rt.clone(),
        image: &svc.cfg.agent.image,
        on_host,
        auto_approve: svc.cfg.agent.auto_approve,
        endpoint: svc.endpoint.as_ref(),
        client: None,
        prices: &svc.prices,
        redactor: run.redactor(),
        run_id: run.id(),
        workdir: first.wt.root(),
        git: Some(&first.wt),
        records: run.path("box"),
        warn: &warn,
        extras: BoxExtras {
            git_writable: false,
            mounts,
            lifeline: svc.lifeline.as_ref().map(|l| l.path.clone()),
            env: ws.env.agent.clone(),
            ..Default::default()
        },
        agent_env: env,
        boxes: None,
        warm: false,
    };
    let _ = run.emit("jobs", Some("agent"), &JobEvent::AgentStarted { attempt });
    let call = Call {
        spec,
        kind: "jobs-agent".into(),
        prompt,
        limits: Limits {
            max_turns: Some(max_turns),
            max_cost_usd: svc.cfg.agent.max_cost_usd,
            wall_time: Some(svc.cfg.agent.wall_time),
            idle: svc.cfg.agent.idle,
            final_grace: Duration::from_secs(5),
        },
        events: Some(EventTarget {
            sink: run.sink().clone(),
            step: Some(attempt.to_string()),
            source: "agent",
        }),
        logs: run.path(&format!("agent-{attempt}")),
        pid_file: Some(run.path("agent.pid")),
        process: ProcessOptions {
            transcript: Some((
                run.path(&format!("agent-{attempt}.log")),
                run.redactor().clone(),
            )),
            final_marker: None,
            tie_to_parent: true,
        },
        prepared: None,
    };
    let stop = stop.clone();
    let result = tokio::select! {
        r = runner.run(call) => Some(r),
        _ = stop.wait() => None,
    };
    let Some(result) = result else {
        // The host group died with the dropped call; the container goes here.
        remove_containers(svc, run.id()).await;
        if on_host {
            let _ = tokio::task::spawn_blocking(belay_agent::orphans::kill_adopted).await;
        }
        return Ok(Session::Stopped);
    };
    let report = result?.report;
    // The box swept its first worktree; the others were mounts of its own.
    if !on_host {
        for r in ws.repos.iter().skip(1) {
            let root = r.wt_path.clone();
            let swept =
                tokio::task::spawn_blocking(move || belay_sandbox::hostfs::sweep_workspace(&root))
                    .await
                    .map_err(|e| {
                        JobsError::Environment(format!("the worktree sweep stopped: {e}"))
                    })?
                    .map_err(|e| {
                        JobsError::Environment(format!(
                            "cannot check the worktree {} after the agent: {e}",
                            r.wt_path.display()
                        ))
                    })?;
            if !swept.setid_cleared.is_empty() {
                let _ = run.emit(
                    "jobs",
                    Some("agent"),
                    &JobEvent::SetidCleared {
                        repo: r.cfg.name.clone(),
                        paths: swept.setid_cleared,
                    },
                );
            }
        }
    }
    let _ = run.emit(
        "jobs",
        Some("agent"),
        &JobEvent::AgentFinished {
            attempt,
            stop: report.stop.describe(),
            turns: report.turns,
            interim: report.interim,
            cost_usd: report.cost_usd,
            duration_s: report.duration_s,
        },
    );
    Ok(Session::Done(Box::new(report)))
}

/// Remove every container of the job's run.
pub async fn remove_containers(svc: &Services, run_id: &str) {
    let Some(rt) = &svc.rt else { return };
    let filter = format!("{}={}", belay_sandbox::labels::RUN, run_id);
    if let Ok(list) = rt.list_containers(&[filter]).await {
        for c in list {
            let _ = rt.remove(&c.id).await;
        }
    }
}
