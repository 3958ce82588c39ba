//! The gates, the same from the command line, the chat and HTTP: a job
//! routed on submission (an owner's to the inbox, anyone else's to
//! `pending/` and the owner asked), accept and decline, approve and discard
//! of a held commit, reset of a sender's context, and requeue of a failed
//! job. Only owners pass a gate; the agent never reaches one.
//!
//! A gate takes the job's [`Id`]: the front end parsed it with the one
//! validator before anything here touches the queue, so a gate never makes
//! a path (a lock, a job file, a run) from text that came from outside.

use belay_record::Id;

use crate::config::RepoConfig;
use crate::events::JobEvent;
use crate::exec::{self, publish, publish::RepoResult, repos::Workspace, Held};
use crate::job::Job;
use crate::queue::{Dir, Queue};
use crate::record::Status;
use crate::services::Services;
use crate::{context, prompt, JobsError};

/// Where a submitted job went.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub id: Id,
    pub waits_for_approval: bool,
}

/// Queue a job: an owner's runs, anyone else's waits for the start approval.
pub fn submit(svc: &Services, mut job: Job) -> Result<Submitted, JobsError> {
    if job.created_at.is_none() {
        job.created_at = Some(belay_record::now_rfc3339());
    }
    job.belay = Default::default();
    job.validate(std::path::Path::new(&format!("job {}", job.id)))?;
    let owner = svc.cfg.is_owner(job.requester());
    // What runs a program or writes a file of the host's choosing is the
    // owner's to say: a third party's job takes the configured agent and
    // the queue's record directory.
    if !owner {
        if let Some(a) = &job.agent {
            return Err(JobsError::Refused(format!(
                "job {}: only the owner's jobs may choose the agent (`{a}`); a request from {} runs the configured one",
                job.id,
                job.requester()
            )));
        }
        if job.runtime.is_some() || job.model.is_some() || job.reasoning_effort.is_some() {
            return Err(JobsError::Refused(format!(
                "job {}: only the owner's jobs may choose the runtime, the model or the effort; a request from {} runs the configured agent",
                job.id,
                job.requester()
            )));
        }
        if let Some(d) = &job.on_complete_dir {
            return Err(JobsError::Refused(format!(
                "job {}: only the owner's jobs may say where the record goes ({})",
                job.id,
                d.display()
            )));
        }
    }
    // Its repositories must resolve now, not when it runs.
    let repos = exec::repos_of(svc, &job)?;
    if owner {
        svc.queue.add(Dir::Inbox, &job)?;
    } else {
        svc.queue.add(Dir::Pending, &job)?;
        let names: Vec<&str> = repos.iter().map(|r| r.name.as_str()).collect();
        let preview = format!(
            "{}\n\n(repositories: {}; role: {}; iteration limit: {})",
            job.preview(400),
            names.join(", "),
            job.pipeline_role.as_str(),
            job.iteration_limit()
        );
        svc.tell_owners(&prompt::start_approval(
            job.id.as_str(),
            job.requester(),
            &preview,
        ));
    }
    Ok(Submitted {
        id: job.id,
        waits_for_approval: !owner,
    })
}

fn need_owner(svc: &Services, by: &str) -> Result<(), JobsError> {
    if svc.cfg.is_owner(by) {
        Ok(())
    } else {
        Err(JobsError::NotOwner { by: by.to_string() })
    }
}

/// The gate's lock on a job the queue holds (an id it has never seen
/// leaves no lock file behind).
fn gate_lock(q: &Queue, id: &Id) -> Result<belay_record::RunLock, JobsError> {
    if q.find(id).is_none() {
        return Err(JobsError::UnknownJob { id: id.clone() });
    }
    q.gate_lock(id)
}

fn waiting(q: &Queue, id: &Id, d: Dir) -> Result<(std::path::PathBuf, Job), JobsError> {
    match q.find(id) {
        Some((at, p)) if at == d => Ok((p.clone(), Queue::read(&p)?)),
        Some((at, _)) => Err(JobsError::NotWaiting {
            id: id.clone(),
            at: at.as_str(),
            want: d.as_str(),
        }),
        None => Err(JobsError::UnknownJob { id: id.clone() }),
    }
}

/// Start a third party's job.
pub fn accept(svc: &Services, id: &Id, by: &str) -> Result<String, JobsError> {
    need_owner(svc, by)?;
    let _gate = gate_lock(&svc.queue, id)?;
    let (path, mut job) = waiting(&svc.queue, id, Dir::Pending)?;
    job.belay.accepted_by = Some(by.to_string());
    svc.queue.relocate(&path, Dir::Inbox, &job)?;
    let ahead = svc.queue.ahead_of(id);
    let _ = svc.outbox.send(
        &job.sender,
        &format!("Your request {id} was accepted; {}", queued_note(ahead)),
    );
    Ok(format!(
        "Job {id} from {} accepted; {} You hear how it ends.",
        job.requester(),
        queued_note(ahead)
    ))
}

/// Where a queued job stands, for its sender.
pub fn queued_note(ahead: Option<usize>) -> String {
    match ahead {
        None => "it is starting now.".into(),
        Some(0) => "it starts next.".into(),
        Some(1) => "it is queued behind 1 job.".into(),
        Some(n) => format!("it is queued behind {n} jobs."),
    }
}

fn declined_record(svc: &Services, job: &Job, report: &str) -> Result<(), JobsError> {
    let rec = exec::plain_record(svc, job, Status::Declined, vec![], report);
    let dir = job
        .on_complete_dir
        .clone()
        .unwrap_or_else(|| svc.queue.sub("done"));
    crate::record::write(&dir, &rec, &svc.redactor)?;
    Ok(())
}

/// Drop a third party's job unseen.
pub fn decline(svc: &Services, id: &Id, by: &str) -> Result<String, JobsError> {
    need_owner(svc, by)?;
    let _gate = gate_lock(&svc.queue, id)?;
    let (path, job) = waiting(&svc.queue, id, Dir::Pending)?;
    fs_err::remove_file(&path).map_err(|e| JobsError::io("remove", &path, e))?;
    declined_record(svc, &job, "declined by the owner; not run")?;
    let _ = svc
        .outbox
        .send(&job.sender, &format!("Your request {id} was not accepted."));
    Ok(format!("Job {id} declined; it did not run."))
}

fn held_of(svc: &Services, id: &Id) -> Result<(std::path::PathBuf, Job, Held), JobsError> {
    let (path, job) = waiting(&svc.queue, id, Dir::Held)?;
    let hp = svc.queue.held_file(id);
    // host-owned: the queue's held/<id>.held (0700, belay's own), named by a parsed id.
    let text = fs_err::read_to_string(&hp).map_err(|e| JobsError::io("read", &hp, e))?;
    let held: Held = serde_json::from_str(&text).map_err(|e| JobsError::BadHeld {
        id: id.clone(),
        why: e.to_string(),
    })?;
    Ok((path, job, held))
}

fn repo_cfg(svc: &Services, name: &str, path: &std::path::Path) -> RepoConfig {
    svc.cfg
        .repos
        .iter()
        .find(|r| r.name == name)
        .cloned()
        .unwrap_or_else(|| RepoConfig::unconfigured(path))
}

/// Commit and push a held change: a fresh worktree from the upstream
/// branch, the held stash applied by SHA, belay's commit.
pub async fn approve(svc: &Services, id: &Id, by: &str) -> Result<String, JobsError> {
    need_owner(svc, by)?;
    let _gate = gate_lock(&svc.queue, id)?;
    let (path, job, held) = held_of(svc, id)?;
    let run = exec::reopen_run(svc, &job)?;
    let repos: Vec<RepoConfig> = held
        .repos
        .iter()
        .map(|r| repo_cfg(svc, &r.name, &r.path))
        .collect();
    let ws = Workspace::prepare(&svc.queue, &run, &job.id, &repos, svc.cfg.lock_wait).await?;
    // Every held change applies first, or nothing is committed; then each
    // is committed and pushed. Whatever happens, the workspace is put back.
    let mut results = Vec::new();
    let mut problem = None;
    for (r, h) in ws.repos.iter().zip(&held.repos) {
        if let Err(e) = r.wt.stash_apply(&h.stash).await {
            problem = Some(format!(
                "the held change of {} no longer applies to {}/{}: {e}. Nothing was committed; discard job {id} and submit the request again",
                h.name, r.remote, r.target
            ));
            break;
        }
    }
    if problem.is_none() {
        for r in &ws.repos {
            match publish::commit_and_push(svc, &run, r, &held.message).await {
                Ok(res) => results.push((r.cfg.name.clone(), r.target.clone(), res)),
                Err(e) => {
                    problem = Some(format!("{}: {e}", r.cfg.name));
                    break;
                }
            }
        }
    }
    let pushed: Vec<(String, String)> = results
        .iter()
        .filter_map(|(n, _, r)| match r {
            RepoResult::Committed {
                hash,
                push_error: None,
                ..
            } => Some((n.clone(), hash.clone())),
            _ => None,
        })
        .collect();
    let keep: Vec<String> = results
        .iter()
        .filter(|(n, _, r)| match r {
            RepoResult::Committed {
                push_error: Some(_),
                ..
            } => true,
            // Not pushed by the config: the job branch keeps it.
            RepoResult::Committed { .. } => repos.iter().any(|c| &c.name == n && !c.push),
            _ => false,
        })
        .map(|(n, _, _)| n.clone())
        .collect();
    // The held stashes are spent once committed; they are dropped while the
    // repositories' locks are still held (a drop is by position).
    if problem.is_none() {
        for (r, h) in ws.repos.iter().zip(&held.repos) {
            let _ = r.main.stash_drop(&h.stash).await;
        }
    }
    let notes = ws.finish(&run, &keep, &pushed).await;
    if let Some(p) = problem {
        if results.is_empty() {
            return Err(JobsError::Refused(p));
        }
        // Some were published: that is recorded, and the job is done.
        svc.tell_owners(&format!(
            "Job {id}: the approval stopped part way: {}",
            crate::public::without_paths(&p)
        ));
    }
    let mut lines = Vec::new();
    let mut commits = Vec::new();
    let mut status = Status::NoChanges;
    for (name, target, r) in &results {
        let pushes = repos
            .iter()
            .find(|c| &c.name == name)
            .is_none_or(|c| c.push);
        let (line, commit) = publish::describe(name, target, id, pushes, r);
        lines.extend(line);
        commits.extend(commit);
        status = match (status, r) {
            (_, RepoResult::Refused(_)) => Status::CheckFailed,
            (
                _,
                RepoResult::Committed {
                    push_error: Some(_),
                    ..
                },
            ) => Status::PublishFailed,
            (Status::NoChanges, RepoResult::Committed { .. }) => Status::Committed,
            (s, _) => s,
        };
    }
    lines.extend(notes);
    let reply = format!("Job {id} approved by {by}.\n{}", lines.join("\n"));
    let rec = {
        let mut r = exec::plain_record(svc, &job, status, commits, &reply);
        r.preserved_branch = (!keep.is_empty()).then(|| exec::repos::job_branch(id));
        r
    };
    exec::finish_record(svc, &run, &job, &rec, &reply).await?;
    fs_err::remove_file(&path).map_err(|e| JobsError::io("remove", &path, e))?;
    let _ = fs_err::remove_file(svc.queue.held_file(id));
    if !svc.cfg.is_owner(&job.sender) {
        let _ = svc.outbox.send(&job.sender, &reply);
    }
    run.finish(belay_record::RunEnd {
        ok: status == Status::Committed,
        summary: Some(format!("approved: {}", status.as_str())),
        ..Default::default()
    });
    Ok(reply)
}

/// Drop a held change: its stash leaves the stash list, nothing is
/// committed.
pub async fn discard(svc: &Services, id: &Id, by: &str) -> Result<String, JobsError> {
    need_owner(svc, by)?;
    let _gate = gate_lock(&svc.queue, id)?;
    let (path, job, held) = held_of(svc, id)?;
    let run = exec::reopen_run(svc, &job)?;
    for h in &held.repos {
        let g = belay_vcs::Git::open(&h.path, &exec::repos::hooks_dir()).await?;
        let _lock = belay_vcs::RepoLock::acquire(
            g.common_dir(),
            &format!("discard of job {id}"),
            svc.cfg.lock_wait,
        )
        .await?;
        match g.stash_drop(&h.stash).await {
            Ok(()) | Err(belay_vcs::VcsError::NoSuchStash(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let _ = run.emit(
            "jobs",
            Some("commit"),
            &JobEvent::CommitRefused {
                repo: h.name.clone(),
                reason: format!("discarded by {by}"),
            },
        );
    }
    let reply = format!("Job {id} discarded; nothing was committed.");
    declined_record(svc, &job, &reply)?;
    fs_err::remove_file(&path).map_err(|e| JobsError::io("remove", &path, e))?;
    let _ = fs_err::remove_file(svc.queue.held_file(id));
    if !svc.cfg.is_owner(&job.sender) {
        let _ = svc.outbox.send(&job.sender, &reply);
    }
    run.finish(belay_record::RunEnd {
        ok: true,
        summary: Some("discarded".into()),
        ..Default::default()
    });
    Ok(reply)
}

/// Drop a sender's carried context.
pub fn reset(svc: &Services, sender: &str) -> Result<String, JobsError> {
    let n = context::reset(&svc.queue, sender)?;
    Ok(if n == 0 {
        "There was no carried context; your next message starts afresh.".into()
    } else {
        "Context dropped. Your next message starts without the previous state.".into()
    })
}

/// Put a failed job back in the inbox.
pub fn requeue(svc: &Services, id: &Id, by: &str) -> Result<String, JobsError> {
    need_owner(svc, by)?;
    let _gate = gate_lock(&svc.queue, id)?;
    let (path, mut job) = waiting(&svc.queue, id, Dir::Failed)?;
    job.belay.failure = None;
    job.belay.requeues = 0;
    svc.queue.relocate(&path, Dir::Inbox, &job)?;
    let _ = fs_err::remove_file(path.with_extension("json.reason"));
    Ok(format!("Job {id} is back in the inbox."))
}
