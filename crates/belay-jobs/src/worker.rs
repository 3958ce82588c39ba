//! `belay jobs work`: recovery of what a killed worker left, then N workers
//! claiming jobs until the inbox is empty (`--once`) or belay is stopped.
//! SIGTERM stops the running agents, puts their jobs back in the inbox with
//! their workspaces as they were, and tells the owner.

use std::sync::Arc;
use std::time::Duration;

use crate::events::JobEvent;
use crate::exec::{self, Ended};
use crate::queue::{Claim, Dir, Recovered};
use crate::record::Status;
use crate::services::Services;
use crate::{context, prompt, JobsError};

/// The one cancellation token: the workers and front ends stop when it trips.
pub use belay_record::Stop;

/// What a `work` did.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub ran: usize,
    pub interrupted: usize,
    pub recovered: usize,
    /// The jobs that ran and failed (their checks, their agent, their push,
    /// their limit), or could not run.
    pub failed: Vec<FailedJob>,
}

/// A job that failed, and why.
#[derive(Debug, Clone)]
pub struct FailedJob {
    pub id: String,
    /// Its status (`check_failed`, `failed`, …).
    pub status: String,
    pub reason: String,
}

/// How one claimed job went.
enum Processed {
    Ran(Option<FailedJob>),
    Interrupted,
}

/// Undo what killed workers left, and requeue (once) or fail their jobs;
/// also undo the workspace of a gate (an approval) that was killed.
pub async fn recover(svc: &Services) -> Result<usize, JobsError> {
    let found = svc.queue.recover()?;
    let runs = svc.queue.sub("runs");
    let mut stranded = Vec::new();
    // host-owned: the queue's runs/ (0700, belay's own; no agent mounts it).
    for e in fs_err::read_dir(&runs)
        .map_err(|e| JobsError::io("read", &runs, e))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(id) = belay_record::Id::parse("run", &name) else {
            continue;
        };
        if found.iter().any(|(j, _)| j.id == id)
            || belay_record::run_id::validate(id.as_str()).is_err()
        {
            continue;
        }
        let touched = belay_record::RunHandle::load_state::<exec::repos::JobState>(&e.path())
            .ok()
            .flatten()
            .is_some_and(|s| !s.touched.is_empty());
        if touched {
            stranded.push(id);
        }
    }
    for id in &stranded {
        // Only when nobody holds the job (a live approval or worker does).
        let Some(_lock) = svc.queue.try_lock_job(id)? else {
            continue;
        };
        let notes = exec::repos::undo(&svc.queue, id, svc.cfg.lock_wait).await?;
        let mut text = format!("job {id}: belay was killed while it held a worktree (an approval, or a commit); it is undone");
        for n in notes {
            text.push_str(&format!("\n{n}"));
        }
        svc.tell_owners(&text);
    }
    for (job, what) in &found {
        let notes = exec::repos::undo(&svc.queue, &job.id, svc.cfg.lock_wait).await?;
        // Pushed before belay was killed: recorded, not run again.
        let pushed = exec::publish::published(&svc.queue.run_dir(&job.id));
        if !pushed.is_empty() {
            if let Some((_, p)) = svc.queue.find(&job.id) {
                let _ = fs_err::remove_file(&p);
            }
            let hashes: Vec<String> = pushed
                .iter()
                .map(|c| format!("{} {}", c.repo, c.hash))
                .collect();
            let text = format!(
                "Job {} was pushed ({}) before belay was killed; it is recorded as committed and not run again.",
                job.id,
                hashes.join(", ")
            );
            // The killed run's own: reopened, not started again.
            if let Ok(run) = exec::reopen_run(svc, job) {
                let rec = exec::plain_record(svc, job, Status::Committed, pushed, &text);
                exec::finish_record(svc, &run, job, &rec, &text).await?;
                run.finish(belay_record::RunEnd {
                    ok: true,
                    summary: Some("committed (recovered after a kill)".into()),
                    ..Default::default()
                });
            }
            reply(svc, job, &text);
            svc.tell_owners(&text);
            continue;
        }
        let msg = match what {
            Recovered::Requeued(m) => m.clone(),
            Recovered::Failed(m) => {
                // Not run again: the killed run ends here, failed.
                if let Ok(run) = exec::reopen_run(svc, job) {
                    run.finish(belay_record::RunEnd {
                        ok: false,
                        summary: Some(svc.redactor.redact(m).into_owned()),
                        ..Default::default()
                    });
                }
                m.clone()
            }
        };
        let mut text = msg;
        for n in notes {
            text.push_str(&format!("\n{n}"));
        }
        svc.tell_owners(&text);
    }
    Ok(found.len())
}

/// Run workers until the inbox is empty (`once`) or `stop`.
pub async fn work(
    svc: Arc<Services>,
    workers: usize,
    once: bool,
    stop: Stop,
    wake: Arc<tokio::sync::Notify>,
) -> Result<Summary, JobsError> {
    svc.ready()?;
    let recovered = recover(&svc).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let svc = svc.clone();
        let stop = stop.clone();
        let wake = wake.clone();
        tasks.spawn(async move { worker(&svc, once, stop, wake).await });
    }
    let mut sum = Summary {
        recovered,
        ..Default::default()
    };
    let mut first_err = None;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(s)) => {
                sum.ran += s.ran;
                sum.interrupted += s.interrupted;
                sum.failed.extend(s.failed);
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(JobsError::Environment(format!("a worker stopped: {e}")));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(sum),
    }
}

async fn worker(
    svc: &Services,
    once: bool,
    stop: Stop,
    wake: Arc<tokio::sync::Notify>,
) -> Result<Summary, JobsError> {
    let mut sum = Summary::default();
    loop {
        if stop.is_set() {
            return Ok(sum);
        }
        match svc.queue.claim()? {
            Some(c) => match process(svc, c, &stop).await? {
                Processed::Interrupted => sum.interrupted += 1,
                Processed::Ran(failed) => {
                    sum.ran += 1;
                    sum.failed.extend(failed);
                }
            },
            None if once => return Ok(sum),
            None => {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = stop.wait() => return Ok(sum),
                }
            }
        }
    }
}

/// Reply to the job's sender, with the first-reply notice once.
pub fn reply(svc: &Services, job: &crate::job::Job, text: &str) {
    let mut text = text.to_string();
    let new = crate::notify::is_chat_address(&job.sender)
        && !context::introduced(&svc.queue, &job.sender);
    if new {
        let window = svc
            .cfg
            .xmpp
            .as_ref()
            .map(|x| x.batch_window.as_secs_f64())
            .unwrap_or(3.0);
        text = format!(
            "{}\n\n{text}",
            prompt::first_reply_notice(job.iteration_limit(), window)
        );
    }
    match svc.outbox.send(&job.sender, &text) {
        Ok(()) => {
            if new {
                let _ = context::mark_introduced(&svc.queue, &job.sender);
            }
        }
        Err(e) => tracing::warn!("cannot queue the reply of job {}: {e}", job.id),
    }
}

/// The name of a job's whole answer in its run.
pub const ANSWER_FILE: &str = "answer.md";

/// A chat answer longer than `[xmpp] long_answer_chars` goes out as its
/// head and a pointer to the whole text, which is kept in the job's run
/// (`answer.md`, redacted): a long answer is a few messages, and never
/// holds up the answers to others.
fn long_answer(svc: &Services, job: &crate::job::Job, text: &str) -> String {
    let Some(x) = svc.cfg.xmpp.as_ref() else {
        return text.to_string();
    };
    let n = text.chars().count();
    if n <= x.long_answer_chars || !crate::notify::is_chat_address(&job.sender) {
        return text.to_string();
    }
    // Redacted whole before it is cut: a secret across the cut would lose
    // the tail its pattern needs, and its head would go out.
    let text = svc.redactor.redact(text).into_owned();
    let n = text.chars().count();
    let path = svc.queue.run_dir(&job.id).join(ANSWER_FILE);
    let kept = belay_record::atomic_write(&path, text.as_bytes());
    if let Err(e) = &kept {
        tracing::warn!("cannot keep the whole answer of job {}: {e}", job.id);
    }
    let head_chars = (x.long_answer_chars / 2).max(400);
    let mut head: String = text.chars().take(head_chars).collect();
    if let Some(cut) = head.rfind('\n').filter(|c| *c > head.len() / 2) {
        head.truncate(cut);
    }
    let whole = match (&x.dashboard_url, kept.is_ok()) {
        (_, false) => "the rest could not be kept; the job's record has its report".to_string(),
        (Some(url), true) => format!("the whole answer: {url}/#/run/{}", job.id),
        (None, true) => format!(
            "the whole answer is kept with job {}: its page in `belay ui`, or answer.md in its run (`belay runs show {}`)",
            job.id, job.id
        ),
    };
    format!(
        "{head}\n\n[… {} more characters; {whole}]",
        n - head.chars().count()
    )
}

/// Run one claimed job and file it.
async fn process(svc: &Services, claim: Claim, stop: &Stop) -> Result<Processed, JobsError> {
    let mut job = claim.job.clone();
    if crate::notify::is_chat_address(&job.sender) {
        let _ = svc
            .outbox
            .send(&job.sender, &format!("Job {} started.", job.id));
    }
    let ended = exec::run(svc, &job, stop).await;
    let processed = match ended {
        Ok(Ended::Finished(f)) => {
            let status = f.record.status;
            let failed = status.failed().then(|| FailedJob {
                id: job.id.to_string(),
                status: status.as_str().into(),
                reason: svc
                    .redactor
                    .redact(
                        f.record
                            .failure_detail
                            .as_deref()
                            .unwrap_or(status.as_str()),
                    )
                    .into_owned(),
            });
            let answer = long_answer(svc, &job, &f.reply);
            reply(svc, &job, &answer);
            // The owner who let a stranger's job in hears how it ended.
            if let Some(by) = job
                .belay
                .accepted_by
                .as_deref()
                .filter(|b| *b != job.sender)
            {
                let reply = svc.redactor.redact(&f.reply);
                let first = reply.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                let _ = svc.outbox.send(
                    by,
                    &format!(
                        "Job {} from {}, which you accepted, ended: {}. {}",
                        job.id,
                        job.requester(),
                        status.as_str(),
                        first.chars().take(300).collect::<String>()
                    ),
                );
            }
            if let Some(h) = &f.held {
                let mut v = serde_json::to_value(h)
                    .map_err(|e| JobsError::Environment(format!("cannot encode: {e}")))?;
                svc.redactor.redact_value(&mut v);
                let text = serde_json::to_vec_pretty(&v)
                    .map_err(|e| JobsError::Environment(format!("cannot encode: {e}")))?;
                belay_record::atomic_write(&svc.queue.held_file(&job.id), &text)?;
                svc.queue.relocate(&claim.path, Dir::Held, &job)?;
                let stat: Vec<String> = h
                    .repos
                    .iter()
                    .map(|r| format!("{}:\n{}", r.name, r.diffstat))
                    .collect();
                svc.tell_owners(&format!(
                    "Job {} from {} waits for your commit approval:\n\n{}\n\nCommit message: {}\n\n/approve {} (/freigeben) commits it; /discard {} (/verwerfen) drops it.",
                    job.id,
                    job.requester(),
                    stat.join("\n"),
                    h.message.lines().next().unwrap_or_default(),
                    job.id,
                    job.id
                ));
            } else if f.record.status == Status::Failed {
                job.belay.failure = Some(
                    svc.redactor
                        .redact(f.record.failure_detail.as_deref().unwrap_or("failed"))
                        .into_owned(),
                );
                svc.queue.relocate(&claim.path, Dir::Failed, &job)?;
            } else {
                let _ = fs_err::remove_file(&claim.path);
            }
            Processed::Ran(failed)
        }
        Ok(Ended::Interrupted) => {
            job.belay.interrupted += 1;
            svc.queue.relocate(&claim.path, Dir::Inbox, &job)?;
            let text = format!(
                "Job {} was interrupted by a shutdown of belay and is back in the queue; it runs again at the next start. Its worktree is gone and the checkout is as it was. /reset drops the carried context.",
                job.id
            );
            svc.tell_owners(&text);
            if !svc.cfg.is_owner(&job.sender) {
                let _ = svc.outbox.send(&job.sender, &text);
            }
            Processed::Interrupted
        }
        Ok(Ended::Failed(f)) => {
            let f = *f;
            failed_early(svc, &claim.path, &mut job, Some(f.run), f.error).await?
        }
        // Its run could not be opened, or its record not written.
        Err(e) => failed_early(svc, &claim.path, &mut job, None, e).await?,
    };
    // The lock file goes while the lock is still held (a job back in the
    // inbox keeps it: another worker may be opening it right now).
    if !matches!(processed, Processed::Interrupted) {
        let _ = fs_err::remove_file(svc.queue.claim_file(&job.id));
    }
    drop(claim);
    Ok(processed)
}

/// A job that could not run (its repositories, its agent spec, a lock):
/// failed, with the reason, a record, and its run ended: the run it opened,
/// or, when it could not open one, the registry's end record all the same
/// (the history never shows a failed job as interrupted).
async fn failed_early(
    svc: &Services,
    path: &std::path::Path,
    job: &mut crate::job::Job,
    run: Option<crate::events::JobRun>,
    e: JobsError,
) -> Result<Processed, JobsError> {
    job.belay.failure = Some(svc.redactor.redact(&e.to_string()).into_owned());
    svc.queue.relocate(path, Dir::Failed, job)?;
    let text = match &run {
        Some(_) => format!("Job {} failed before its agent ran: {}", job.id, e.reply()),
        None => format!("Job {} failed: {}", job.id, e.reply()),
    };
    reply(svc, job, &text);
    let reason = svc.redactor.redact(&e.to_string()).into_owned();
    let failed = JobEvent::JobFailed {
        job_id: job.id.to_string(),
        reason: reason.clone(),
    };
    // Its run, when it has none here: reopened, never started a second
    // time (a run that failed to write its record has its start; a run
    // another process holds is that process's to end).
    let mut locked = false;
    let run = match run {
        Some(r) => Some(r),
        None => match exec::reopen_run(svc, job) {
            Ok(r) => Some(r),
            Err(JobsError::Record(belay_record::RecordError::Locked { .. })) => {
                locked = true;
                None
            }
            Err(_) => None,
        },
    };
    if let Some(run) = run {
        let _ = run.emit("jobs", None, &failed);
        let rec = {
            let mut r = exec::plain_record(svc, job, Status::Failed, vec![], &text);
            r.failure_detail = Some(e.to_string());
            r
        };
        let _ = exec::finish_record(svc, &run, job, &rec, &text).await;
        run.finish(belay_record::RunEnd {
            ok: false,
            summary: Some(format!("failed: {e}")),
            ..Default::default()
        });
    } else {
        svc.tell(&failed);
        if !locked {
            let _ = belay_record::Registry::default_location().ended(
                job.id.as_str(),
                belay_record::RunEnd {
                    ok: false,
                    summary: Some(reason.clone()),
                    ..Default::default()
                },
            );
        }
    }
    Ok(Processed::Ran(Some(FailedJob {
        id: job.id.to_string(),
        status: Status::Failed.as_str().into(),
        reason,
    })))
}
