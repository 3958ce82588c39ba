//! One job, start to end: its run (a `RunHandle` in `runs/<id>`), its
//! repositories prepared ([`repos`]), the agent session ([`agent`]), the
//! answer judged (the commit block; a fixer's FIX_RESULT, with one format
//! correction), the checks, the commit and push or the hold
//! ([`publish`]), the workspace put back, the completion record and the
//! on-commit hook ([`crate::record`]), and the reply.

pub mod agent;
pub mod publish;
pub mod repos;

use std::time::Instant;

use belay_agent::StopReason;
use belay_record::{Mode, OpenRun, Registry, RunEnd, RunHandle};
use serde::{Deserialize, Serialize};

use crate::answer::{self, FixResult, Outcome};
use crate::config::RepoConfig;
use crate::context;
use crate::events::{JobEvent, JobRun};
use crate::job::{Job, Role};
use crate::prompt::{self, Place};
use crate::record::{self, CommitRef, CompletionRecord, Profile, Status, Telemetry, Tokens};
use crate::services::Services;
use crate::worker::Stop;
use crate::JobsError;
use agent::Session;
use publish::RepoResult;
use repos::Workspace;

/// A job's change held for the owner's commit approval (`held/<id>.held`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Held {
    pub job_id: String,
    pub message: String,
    pub repos: Vec<HeldRepo>,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeldRepo {
    pub name: String,
    pub path: std::path::PathBuf,
    pub stash: String,
    pub diffstat: String,
}

/// How a job ended.
pub enum Ended {
    Finished(Box<Finished>),
    /// Stopped by SIGTERM: the workspace is back as it was.
    Interrupted,
    /// It could not run (its agent spec, its repositories, a lock): the
    /// error, and the run it opened, which the caller ends with the failure
    /// (one start record and one end record per job).
    Failed(Box<EarlyFailure>),
}

pub struct EarlyFailure {
    pub run: JobRun,
    pub error: JobsError,
}

pub struct Finished {
    pub record: CompletionRecord,
    /// What the sender is told.
    pub reply: String,
    pub held: Option<Held>,
}

/// Whether the repository `name` of a job is pushed (`push = true`).
fn pushes(repos: &[(String, bool)], name: &str) -> bool {
    repos
        .iter()
        .find(|(n, _)| n == name)
        .is_none_or(|(_, p)| *p)
}

/// Open (or reopen) a job's run.
pub fn open_run(svc: &Services, job: &Job) -> Result<JobRun, JobsError> {
    open_job_run(svc, job, RunHandle::open)
}

/// Reopen the run of a job that ended (its held change approved or
/// discarded): one start record per run, its new end record the last.
pub fn reopen_run(svc: &Services, job: &Job) -> Result<JobRun, JobsError> {
    open_job_run(svc, job, RunHandle::reopen)
}

fn open_job_run(
    svc: &Services,
    job: &Job,
    open: fn(OpenRun<'_>) -> Result<RunHandle, belay_record::RecordError>,
) -> Result<JobRun, JobsError> {
    let title = format!("job {}: {}", job.id, job.preview(60));
    let run = open(OpenRun {
        dir: svc.queue.run_dir(&job.id),
        id: job.id.as_str(),
        mode: Mode::Jobs,
        title: Some(&title),
        repo: None,
        redactor: svc.redactor.clone(),
        registry: Registry::default_location(),
    })?;
    Ok(JobRun::new(run, svc.observer.clone()))
}

/// The repositories a job may write.
pub fn repos_of(svc: &Services, job: &Job) -> Result<Vec<RepoConfig>, JobsError> {
    let owner = svc.cfg.is_owner(job.requester());
    let repos: Vec<RepoConfig> = if job.repos.is_empty() {
        svc.cfg.default_repos()
    } else {
        job.repos
            .iter()
            .map(|r| svc.cfg.repo_for(r, owner))
            .collect::<Result<_, _>>()?
    };
    let mut names: Vec<&str> = repos.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(JobsError::Refused(format!(
            "job {} names two repositories called `{}`: their worktrees would be one; give distinct [[repo]] names",
            job.id,
            names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]).unwrap_or_default()
        )));
    }
    if repos.is_empty() {
        return Err(JobsError::Refused(format!(
            "job {} names no repository and the config has no default: submit with --repo PATH, or set `default = true` on a [[repo]] in jobs.toml",
            job.id
        )));
    }
    Ok(repos)
}

fn seconds_since(rfc3339: Option<&str>) -> Option<f64> {
    let t: jiff::Timestamp = rfc3339?.parse().ok()?;
    let d = jiff::Timestamp::now().duration_since(t);
    Some(d.as_secs_f64().max(0.0))
}

struct Tally {
    tokens: Tokens,
    cost_usd: f64,
    agent_s: f64,
    turns: u32,
}

impl Tally {
    fn add(&mut self, r: &belay_agent::AgentReport) {
        self.tokens.input += r.usage.input_tokens;
        self.tokens.output += r.usage.output_tokens;
        self.tokens.cached_input += r.usage.cached_tokens;
        self.cost_usd += r.cost_usd;
        self.agent_s += r.duration_s;
        self.turns += r.turns;
    }
}

/// Record (and tell) that the job started.
fn announce_start(run: &JobRun, job: &Job, spec: &belay_agent::AgentSpec, repos: &[RepoConfig]) {
    let _ = run.emit(
        "jobs",
        None,
        &JobEvent::JobStarted {
            job_id: job.id.to_string(),
            sender: job.sender.clone(),
            requested_by: job.requester().to_string(),
            role: job.pipeline_role.as_str(),
            agent: spec.to_string(),
            iteration_limit: job.iteration_limit(),
            repos: repos.iter().map(|r| r.name.clone()).collect(),
            queued_s: seconds_since(job.created_at.as_deref()),
        },
    );
}

/// The repositories pushed (name, hash) and those whose job branch is kept.
fn pushed_and_kept(
    outcome: &Result<Option<Judged>, JobsError>,
    ws: &Workspace,
) -> (Vec<(String, String)>, Vec<String>) {
    match outcome {
        Ok(Some(o)) => (
            o.results
                .iter()
                .filter_map(|(n, r)| match r {
                    RepoResult::Committed {
                        hash,
                        push_error: None,
                        ..
                    } => Some((n.clone(), hash.clone())),
                    _ => None,
                })
                .collect(),
            o.results
                .iter()
                .filter_map(|(n, r)| match r {
                    RepoResult::Committed {
                        push_error: Some(_),
                        ..
                    } => Some(n.clone()),
                    // Not pushed by the config: the job branch keeps it.
                    RepoResult::Committed { .. }
                        if ws.repos.iter().any(|w| &w.cfg.name == n && !w.cfg.push) =>
                    {
                        Some(n.clone())
                    }
                    _ => None,
                })
                .collect(),
        ),
        _ => (vec![], vec![]),
    }
}

/// The commits, the reply and the fixer outcome from each repository's result.
fn reply_and_commits(
    job: &Job,
    outcome: &Judged,
    ws_names: &[(String, bool)],
    targets: &[(String, String)],
    notes: &[String],
) -> (String, Vec<CommitRef>, Option<FixResult>) {
    let mut commits = Vec::new();
    let mut lines = Vec::new();
    let mut fixer = outcome.fixer.clone();
    for (name, r) in &outcome.results {
        let target = targets
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        let (line, commit) = publish::describe(name, &target, &job.id, pushes(ws_names, name), r);
        lines.extend(line);
        if let Some(c) = commit {
            if let (
                Some(f),
                RepoResult::Committed {
                    push_error: None, ..
                },
            ) = (&mut fixer, r)
            {
                if pushes(ws_names, name) {
                    f.commit_hash = Some(c.hash.clone());
                    f.pushed_branch = Some(c.branch.clone());
                }
            }
            commits.push(c);
        }
    }
    let mut reply = outcome.text.trim().to_string();
    if !lines.is_empty() {
        reply.push_str("\n\n");
        reply.push_str(&lines.join("\n"));
    }
    for n in notes {
        reply.push_str("\n\n");
        reply.push_str(n);
    }
    (reply, commits, fixer)
}

/// Run a claimed job. An error is the run's that could not be opened.
pub async fn run(svc: &Services, job: &Job, stop: &Stop) -> Result<Ended, JobsError> {
    let run = open_run(svc, job)?;
    let started = Instant::now();
    // Only what fails before the agent runs is an early failure: after it,
    // commits may be pushed or a change held.
    let (spec, ws) = match prepare_job(svc, job, &run).await {
        Ok(ready) => ready,
        Err(error) => return Ok(Ended::Failed(Box::new(EarlyFailure { run, error }))),
    };
    run_prepared(svc, job, stop, &run, started, spec, ws).await
}

/// The job's agent spec and its workspace (worktrees and sandbox), or why
/// it cannot run.
async fn prepare_job(
    svc: &Services,
    job: &Job,
    run: &JobRun,
) -> Result<(belay_agent::AgentSpec, Workspace), JobsError> {
    let spec = agent::spec_for(svc, job)?;
    let repos = repos_of(svc, job)?;
    announce_start(run, job, &spec, &repos);
    let mut ws = Workspace::prepare(&svc.queue, run, &job.id, &repos, svc.cfg.lock_wait).await?;
    match agent::run_env(svc, run, &ws).await {
        Ok(env) => ws.env = env,
        Err(e) => {
            // The worktrees go as after any job.
            let _ = ws.finish(run, &[], &[]).await;
            return Err(e);
        }
    }
    Ok((spec, ws))
}

async fn run_prepared(
    svc: &Services,
    job: &Job,
    stop: &Stop,
    run: &JobRun,
    started: Instant,
    spec: belay_agent::AgentSpec,
    ws: Workspace,
) -> Result<Ended, JobsError> {
    let mut tally = Tally {
        tokens: Tokens::default(),
        cost_usd: 0.0,
        agent_s: 0.0,
        turns: 0,
    };
    let outcome = judge_and_publish(svc, run, job, &ws, &spec, stop, &mut tally).await;
    let (pushed, keep) = pushed_and_kept(&outcome, &ws);
    let ws_names: Vec<(String, bool)> = ws
        .repos
        .iter()
        .map(|r| (r.cfg.name.clone(), r.cfg.push))
        .collect();
    let targets: Vec<(String, String)> = ws
        .repos
        .iter()
        .map(|r| (r.cfg.name.clone(), r.target.clone()))
        .collect();
    if let Some(rt) = &svc.rt {
        ws.env.remove(rt.as_ref()).await;
    }
    for r in &ws.repos {
        ws.env.tidy(&r.wt_path);
    }
    let notes = ws.finish(run, &keep, &pushed).await;
    let outcome = match outcome {
        Ok(Some(o)) => o,
        Ok(None) => {
            let _ = run.emit(
                "jobs",
                None,
                &JobEvent::JobInterrupted {
                    job_id: job.id.to_string(),
                    reason: "belay is shutting down (SIGTERM)".into(),
                },
            );
            run.interrupted(RunEnd {
                ok: false,
                duration_s: started.elapsed().as_secs_f64(),
                tokens: tally.tokens.input + tally.tokens.output,
                cost_usd: tally.cost_usd,
                summary: Some(
                    "stopped: belay is shutting down; the job runs again at the next start".into(),
                ),
            });
            return Ok(Ended::Interrupted);
        }
        Err(e) => Judged {
            status: Status::Failed,
            text: format!("The job failed: {}", e.reply()),
            results: vec![],
            fixer: None,
            failure: Some(e.to_string()),
            held: None,
        },
    };
    let (reply, commits, fixer) = reply_and_commits(job, &outcome, &ws_names, &targets, &notes);
    let status = outcome.status;
    let record = CompletionRecord {
        job_id: job.id.to_string(),
        status,
        commits,
        completed_at: belay_record::now_rfc3339(),
        runtime: spec.to_string(),
        configured_profile: Profile {
            runtime: job.runtime.clone().unwrap_or_else(|| spec.to_string()),
            model: job.model.clone().or(spec.model.clone()),
            reasoning_effort: job.reasoning_effort.clone(),
            iteration_limit: job.iteration_limit(),
        },
        telemetry: Telemetry {
            tokens: tally.tokens.clone(),
            cost_usd: tally.cost_usd,
            duration_s: started.elapsed().as_secs_f64(),
            agent_s: tally.agent_s,
            turns: tally.turns,
        },
        report: reply.clone(),
        pipeline_role: job.pipeline_role.as_str().into(),
        requested_by: Some(job.requester().to_string()),
        pipeline_run_id: job.pipeline_run_id.clone(),
        board_slug: job.board_slug.clone(),
        fixer_outcome: fixer,
        failure_detail: outcome.failure.clone(),
        preserved_branch: (!keep.is_empty()).then(|| repos::job_branch(&job.id)),
    };
    finish_record(svc, run, job, &record, &reply).await?;
    let overhead = (started.elapsed().as_secs_f64() - tally.agent_s).max(0.0);
    let _ = run.emit(
        "jobs",
        None,
        &JobEvent::JobFinished {
            job_id: job.id.to_string(),
            status: status.as_str().into(),
            reason: outcome.failure.clone(),
            commits: record.commits.len(),
            overhead_s: overhead,
            duration_s: started.elapsed().as_secs_f64(),
        },
    );
    run.finish(RunEnd {
        ok: matches!(status, Status::Committed | Status::NoChanges | Status::Held),
        duration_s: started.elapsed().as_secs_f64(),
        tokens: tally.tokens.input + tally.tokens.output,
        cost_usd: tally.cost_usd,
        summary: Some(status.as_str().into()),
    });
    Ok(Ended::Finished(Box::new(Finished {
        record,
        reply,
        held: outcome.held,
    })))
}

/// A record for a job that ended without an agent's telemetry (declined,
/// discarded, approved later, failed before its agent, recovered).
pub fn plain_record(
    svc: &Services,
    job: &Job,
    status: Status,
    commits: Vec<CommitRef>,
    report: &str,
) -> CompletionRecord {
    CompletionRecord {
        job_id: job.id.to_string(),
        status,
        commits,
        completed_at: belay_record::now_rfc3339(),
        runtime: job
            .agent
            .clone()
            .or(job.runtime.clone())
            .unwrap_or_else(|| svc.cfg.agent.spec.clone()),
        configured_profile: Profile {
            runtime: job.runtime.clone().unwrap_or_default(),
            model: job.model.clone(),
            reasoning_effort: job.reasoning_effort.clone(),
            iteration_limit: job.iteration_limit(),
        },
        telemetry: Default::default(),
        report: report.to_string(),
        pipeline_role: job.pipeline_role.as_str().into(),
        requested_by: Some(job.requester().to_string()),
        pipeline_run_id: job.pipeline_run_id.clone(),
        board_slug: job.board_slug.clone(),
        fixer_outcome: None,
        failure_detail: None,
        preserved_branch: None,
    }
}

/// Write the record, carry the reply into the sender's next job, run the
/// hook for a commit.
pub async fn finish_record(
    svc: &Services,
    run: &JobRun,
    job: &Job,
    record: &CompletionRecord,
    reply: &str,
) -> Result<(), JobsError> {
    let dir = job
        .on_complete_dir
        .clone()
        .unwrap_or_else(|| svc.queue.sub("done"));
    record::write(&dir, record, run.redactor())?;
    if !job.fresh_session {
        context::save(
            &svc.queue,
            job.requester(),
            job.board_slug.as_deref(),
            job.id.as_str(),
            reply,
            run.redactor(),
        )?;
    }
    if record.status == Status::Committed && !svc.cfg.on_commit.is_empty() {
        let path = dir.join(format!("{}.json", job.id));
        let hook = record::run_hook(
            &svc.cfg.on_commit,
            &svc.queue.sub("hooks"),
            &path,
            record,
            svc.cfg.on_commit_timeout,
            &run.path("on-commit.log"),
        )
        .await;
        match hook {
            Ok(h) if !h.skipped => {
                let _ = run.emit(
                    "jobs",
                    Some("hook"),
                    &JobEvent::HookRan {
                        hash: record
                            .commits
                            .first()
                            .map(|c| c.hash.clone())
                            .unwrap_or_default(),
                        exit_code: h.exit_code,
                        ok: h.ok,
                    },
                );
                if !h.ok {
                    // Chat shows no host path: the log is named in the run.
                    svc.tell_owners(&format!(
                        "The on-commit hook failed for job {} (exit {:?}); see on-commit.log of its run (belay runs show {})",
                        job.id,
                        h.exit_code,
                        job.id
                    ));
                }
            }
            Ok(_) => {}
            Err(e) => svc.tell_owners(&format!(
                "The on-commit hook of job {} did not run: {}",
                job.id,
                e.reply()
            )),
        }
    }
    Ok(())
}

/// What the answer gave.
struct Judged {
    status: Status,
    /// The answer as the sender sees it (without its blocks).
    text: String,
    results: Vec<(String, RepoResult)>,
    fixer: Option<FixResult>,
    failure: Option<String>,
    held: Option<Held>,
}

impl Judged {
    fn plain(status: Status, text: String) -> Judged {
        Judged {
            status,
            text,
            results: vec![],
            fixer: None,
            failure: None,
            held: None,
        }
    }
}

fn places(ws: &Workspace, on_host: bool) -> Vec<Place> {
    ws.repos
        .iter()
        .enumerate()
        .map(|(i, r)| Place {
            name: r.cfg.name.clone(),
            path: if on_host {
                r.wt_path.display().to_string()
            } else {
                repos::container_path(i, &r.cfg.name)
            },
            target: format!("{}/{}", r.remote, r.target),
            checks: r.cfg.checks.clone(),
            commit_approval: r.cfg.commit_approval,
        })
        .collect()
}

/// The answer's prompt for the job's role, with the sender's carried context.
fn answer_prompt(svc: &Services, job: &Job, ws: &Workspace) -> String {
    let on_host = svc.cfg.agent.placement == crate::config::Placement::Host;
    let carried = if job.fresh_session {
        None
    } else {
        context::load(&svc.queue, job.requester(), job.board_slug.as_deref())
    };
    let p = places(ws, on_host);
    match job.pipeline_role {
        Role::Builder => prompt::builder(
            &p,
            job.requester(),
            carried.as_ref().map(|c| c.text.as_str()),
            &job.body,
        ),
        Role::Fixer => prompt::fixer(
            &p,
            job.requester(),
            carried.as_ref().map(|c| c.text.as_str()),
            &job.body,
        ),
    }
}

/// The judgement of a session that hit its limit or failed; `None`: it completed.
fn unfinished(report: &belay_agent::AgentReport, limit: u32) -> Option<Judged> {
    // A limit is the iteration limit's interim report; a CLI that crashed
    // (an interim text too, from its partial output) failed, with its reason.
    let limit_hit = matches!(
        report.stop,
        StopReason::TurnLimit { .. }
            | StopReason::CostLimit { .. }
            | StopReason::WallTime { .. }
            | StopReason::Idle { .. }
    );
    if limit_hit {
        return Some(Judged::plain(
            Status::LimitReached,
            prompt::interim(limit, &report.final_text),
        ));
    }
    if !report.ok() {
        let why = format!(
            "the agent {}{}",
            report.stop.describe(),
            report
                .exit_code
                .map(|c| format!(" (exit {c})"))
                .unwrap_or_default()
        );
        let mut j = Judged::plain(
            Status::Failed,
            format!(
                "The job failed: {why}.\n{}",
                belay_agent::checks::last_chars(report.stderr_tail.trim(), 1500)
            ),
        );
        j.failure = Some(why);
        return Some(j);
    }
    None
}

/// What an answer gives: the text shown, the commit message, the fixer's result.
type Answer = (String, Option<String>, Option<FixResult>);

/// A fixer's answer, with its one format correction. `None`: stopped.
#[allow(clippy::too_many_arguments)]
async fn fixer_answer(
    svc: &Services,
    run: &JobRun,
    ws: &Workspace,
    spec: &belay_agent::AgentSpec,
    stop: &Stop,
    tally: &mut Tally,
    final_text: &str,
    limit: u32,
) -> Result<Option<Answer>, JobsError> {
    Ok(Some(match answer::fix_result(final_text) {
        Ok(a) => (a.result.summary.clone(), a.message, Some(a.result)),
        Err(first) => {
            let _ = run.emit(
                "jobs",
                Some("agent"),
                &JobEvent::FixResultInvalid {
                    attempt: "answer",
                    error: first.clone(),
                },
            );
            let fix = prompt::correction(&first, final_text);
            let second =
                match agent::session(svc, run, ws, spec, "correction", &fix, limit.min(5), stop)
                    .await?
                {
                    Session::Stopped => return Ok(None),
                    Session::Done(r) => r,
                };
            tally.add(&second);
            let verdict = if second.interim || !second.ok() {
                Err(format!("the correction {}", second.stop.describe()))
            } else {
                answer::fix_result(&second.final_text)
            };
            match verdict {
                Ok(a) => (a.result.summary.clone(), a.message, Some(a.result)),
                Err(e) => {
                    let _ = run.emit(
                        "jobs",
                        Some("agent"),
                        &JobEvent::FixResultInvalid {
                            attempt: "correction",
                            error: e.clone(),
                        },
                    );
                    let f = answer::fallback(&e);
                    (f.summary.clone(), None, Some(f))
                }
            }
        }
    }))
}

/// Commit and push each repository, or hold it for the owner's approval.
async fn commit_or_hold(
    svc: &Services,
    run: &JobRun,
    job: &Job,
    ws: &Workspace,
    message: &str,
) -> Result<(Vec<(String, RepoResult)>, Vec<HeldRepo>), JobsError> {
    let mut results = Vec::new();
    let mut held = Vec::new();
    for r in &ws.repos {
        let res = if r.cfg.commit_approval {
            let res = publish::hold(run, r, job.id.as_str()).await?;
            if let RepoResult::Held { stash } = &res {
                // What the owner approves is the whole stash: the new
                // (untracked) files too, each named.
                let diffstat = publish::held_summary(&r.main, stash).await;
                held.push(HeldRepo {
                    name: r.cfg.name.clone(),
                    path: r.cfg.path.clone(),
                    stash: stash.clone(),
                    diffstat: diffstat.trim().to_string(),
                });
            }
            res
        } else {
            publish::commit_and_push(svc, run, r, message).await?
        };
        results.push((r.cfg.name.clone(), res));
    }
    if !held.is_empty() {
        record_held_patch(run, ws, &held).await;
    }
    Ok((results, held))
}

/// The held change's whole patch, each repository's under its name, as the
/// run's `held.diff`: what the owner approves, shown on the dashboard's
/// approval card and run page before anything is committed. A failure to
/// record it is logged; the summary still stands.
async fn record_held_patch(run: &JobRun, ws: &Workspace, held: &[HeldRepo]) {
    let mut text = String::new();
    for h in held {
        let Some(r) = ws.repos.iter().find(|r| r.cfg.name == h.name) else {
            continue;
        };
        let patch = r
            .main
            .stash_patch(&h.stash, HELD_PATCH_MAX)
            .await
            .unwrap_or_else(|e| format!("[belay: the patch could not be read: {e}]\n"));
        text.push_str(&format!("# repository {}\n{patch}\n", h.name));
    }
    if let Err(e) = run.write_text(HELD_PATCH, &text) {
        tracing::warn!("cannot record the held patch of run {}: {e}", run.id());
    }
}

/// The run's record of its held change.
pub const HELD_PATCH: &str = "held.diff";
/// What `held.diff` keeps of each repository's patch.
const HELD_PATCH_MAX: usize = 1 << 20;

/// The job's status from its repositories' results.
fn status_of(results: &[(String, RepoResult)], held: &[HeldRepo]) -> Status {
    let any = |f: fn(&RepoResult) -> bool| results.iter().any(|(_, r)| f(r));
    if any(|r| {
        matches!(
            r,
            RepoResult::Committed {
                push_error: Some(_),
                ..
            }
        )
    }) {
        Status::PublishFailed
    } else if any(|r| matches!(r, RepoResult::Refused(_))) {
        Status::CheckFailed
    } else if any(|r| matches!(r, RepoResult::Committed { .. })) {
        Status::Committed
    } else if !held.is_empty() {
        Status::Held
    } else {
        Status::NoChanges
    }
}

/// The agent, the answer, the checks and the commits. `None`: stopped.
async fn judge_and_publish(
    svc: &Services,
    run: &JobRun,
    job: &Job,
    ws: &Workspace,
    spec: &belay_agent::AgentSpec,
    stop: &Stop,
    tally: &mut Tally,
) -> Result<Option<Judged>, JobsError> {
    let prompt = answer_prompt(svc, job, ws);
    let limit = job.iteration_limit();
    let report = match agent::session(svc, run, ws, spec, "answer", &prompt, limit, stop).await? {
        Session::Stopped => return Ok(None),
        Session::Done(r) => r,
    };
    tally.add(&report);
    if let Some(j) = unfinished(&report, limit) {
        return Ok(Some(j));
    }
    let (text, message, fixer) = match job.pipeline_role {
        Role::Builder => {
            let b = answer::commit_block(&report.final_text);
            let mut text = b.text;
            if let Some(p) = &b.problem {
                text.push_str(&format!("\n\n{p}."));
            }
            (text, b.message, None)
        }
        Role::Fixer => {
            match fixer_answer(svc, run, ws, spec, stop, tally, &report.final_text, limit).await? {
                Some(a) => a,
                None => return Ok(None),
            }
        }
    };
    let Some(message) = message else {
        let note = if job.pipeline_role == Role::Builder && !text.contains("nothing was committed")
        {
            "\n\nNothing was committed: the answer has no commit block."
        } else {
            ""
        };
        let mut j = Judged::plain(Status::NoChanges, format!("{}{note}", text.trim()));
        j.fixer = fixer;
        return Ok(Some(j));
    };
    if let Some(failed) = publish::checks(svc, run, ws).await? {
        let mut j = Judged::plain(Status::CheckFailed, format!("{}\n\n{failed}", text.trim()));
        j.failure = Some(failed);
        j.fixer = fixer;
        return Ok(Some(j));
    }
    let (results, held) = commit_or_hold(svc, run, job, ws, &message).await?;
    let status = status_of(&results, &held);
    let mut text = text.trim().to_string();
    if status == Status::NoChanges {
        text.push_str("\n\nNothing was committed: no file changed.");
    }
    let failure = results.iter().find_map(|(_, r)| match r {
        RepoResult::Committed {
            push_error: Some(e),
            ..
        } => Some(e.clone()),
        RepoResult::Refused(e) => Some(e.clone()),
        _ => None,
    });
    let fixer = fixer.map(|mut f| {
        if f.outcome == Outcome::Repaired && status != Status::Committed {
            f.commit_hash = None;
        }
        f
    });
    Ok(Some(Judged {
        status,
        text,
        results,
        fixer,
        failure,
        held: (!held.is_empty()).then(|| Held {
            job_id: job.id.to_string(),
            message,
            repos: held,
            created_at: belay_record::now_rfc3339(),
        }),
    }))
}
