//! `belay jobs`: the job queue builder of `belay_jobs`. The command line is
//! the owner (`local`): its gates pass.

use std::io::Read;
use std::sync::Arc;

use belay_jobs::config::{self, Placement, LOCAL_SENDER};
use belay_jobs::queue::{Dir, Queue};
use belay_jobs::{gates, Config, Job, JobsError, Services};
use belay_record::Id;
use belay_sandbox::ContainerRuntime;

use crate::cli::{JobsArgs, JobsCommand, ListArgs, SubmitArgs, WorkArgs};
use crate::exit::{infra, io, usage, Failure, EXIT_FAILED};
use crate::output::jobs::JobLines;
use crate::output::{EventView, Printer};

/// The engine, when agents or checks run in containers.
async fn engine(cfg: &Config, needed: bool) -> Result<Option<Arc<dyn ContainerRuntime>>, Failure> {
    let containers = cfg.agent.placement == Placement::Container
        || cfg.repos.iter().any(|r| !r.checks.is_empty());
    if !(needed && containers) {
        return Ok(None);
    }
    Ok(Some(Arc::new(crate::context::connect().await?)))
}

pub async fn jobs(p: &Printer, a: JobsArgs) -> Result<u8, Failure> {
    let mut cfg = config::locate(a.config.as_deref(), a.queue.as_deref())?;
    // Only the worker and the commit gates need the engine.
    let needs_engine = matches!(a.command, JobsCommand::Work(_) | JobsCommand::Approve(_));
    let rt = engine(&cfg, needs_engine).await?;
    // The image: as named (an image or an env build's run id), else the
    // latest env build of the one repository when it has git, else the
    // agent image.
    if matches!(a.command, JobsCommand::Work(_)) {
        let named = cfg.agent.image_named.then(|| cfg.agent.image.clone());
        let only = match cfg.repos.as_slice() {
            [only] => Some(only.path.clone()),
            _ => None,
        };
        cfg.agent.image = crate::context::sandbox_image(
            p,
            rt.as_deref(),
            only.as_deref(),
            named.as_deref(),
            belay_sandbox::bootstrap::AGENT_IMAGE,
            &["git"],
        )
        .await?;
    }
    let json = matches!(&a.command, JobsCommand::Work(w) if w.json);
    let svc = Services::open(cfg, rt, Arc::new(EventView::new(p, JobLines, json)))?;
    match a.command {
        JobsCommand::Submit(s) => submit(p, &svc, *s),
        JobsCommand::Work(w) => work(p, svc, w).await,
        JobsCommand::List(l) => list(p, &svc, &l),
        JobsCommand::Show(s) => show(p, &svc, &job_id(&s.id)?, s.json),
        JobsCommand::Accept(i) => said(p, gates::accept(&svc, &job_id(&i.id)?, LOCAL_SENDER)),
        JobsCommand::Decline(i) => said(p, gates::decline(&svc, &job_id(&i.id)?, LOCAL_SENDER)),
        JobsCommand::Approve(i) => {
            let id = job_id(&i.id)?;
            said(p, gates::approve(&svc, &id, LOCAL_SENDER).await)
        }
        JobsCommand::Discard(i) => {
            let id = job_id(&i.id)?;
            said(p, gates::discard(&svc, &id, LOCAL_SENDER).await)
        }
        JobsCommand::Reset(s) => said(
            p,
            gates::reset(&svc, s.sender.as_deref().unwrap_or(LOCAL_SENDER)),
        ),
        JobsCommand::Requeue(i) => said(p, gates::requeue(&svc, &job_id(&i.id)?, LOCAL_SENDER)),
    }
}

/// A job id from the command line, parsed by the one validator of ids
/// (exit 2 when it is none).
fn job_id(raw: &str) -> Result<Id, JobsError> {
    Ok(Id::parse("job", raw)?)
}

fn said(p: &Printer, r: Result<String, belay_jobs::JobsError>) -> Result<u8, Failure> {
    p.out(r?);
    Ok(0)
}

fn submit(p: &Printer, svc: &Services, s: SubmitArgs) -> Result<u8, Failure> {
    let body = match s.body.as_deref() {
        Some(b) if b != "-" => b.to_string(),
        _ => {
            let mut b = String::new();
            std::io::stdin()
                .read_to_string(&mut b)
                .map_err(|e| io("read the request from stdin", e))?;
            b
        }
    };
    let mut job = Job::new(s.sender.as_deref().unwrap_or(LOCAL_SENDER), &body);
    job.requested_by = s.requested_by;
    job.repos = s
        .repos
        .iter()
        .map(|r| {
            // A path is made absolute here, where it was meant.
            let path = std::path::Path::new(r);
            if (r.contains('/') || path.exists()) && !path.is_absolute() {
                std::path::absolute(path)
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| r.clone())
            } else {
                r.clone()
            }
        })
        .collect();
    job.agent = s.agent;
    job.runtime = s.runtime;
    job.model = s.model;
    job.reasoning_effort = s.reasoning_effort;
    job.iteration_limit = s.iteration_limit;
    job.pipeline_role = s.role.parse().map_err(usage)?;
    job.on_complete_dir = s.on_complete.map(|d| std::path::absolute(&d).unwrap_or(d));
    job.board_slug = s.board;
    job.fresh_session = s.fresh;
    job.source = Some("cli".into());
    let r = gates::submit(svc, job)?;
    if r.waits_for_approval {
        p.out(format!(
            "{} (waits for the owner's approval: belay jobs accept {})",
            r.id, r.id
        ));
    } else {
        p.out(&r.id);
    }
    Ok(0)
}

async fn work(p: &Printer, svc: Services, w: WorkArgs) -> Result<u8, Failure> {
    let workers = w.workers.unwrap_or(svc.cfg.workers);
    if workers == 0 || workers > 64 {
        return Err(usage(format!("--workers {workers}: give 1 to 64")));
    }
    // What is missing is said before anything starts.
    svc.ready()?;
    if !w.once {
        svc.ready_front()?;
    }
    let svc = Arc::new(svc);
    let stop = crate::context::stop_on_signals()?;
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut fronts = tokio::task::JoinSet::new();
    if w.once {
        if let Some(d) = &svc.cfg.drop {
            belay_jobs::front::drop::sweep(&svc, &d.dir, d.trusted)?;
        }
    } else {
        if svc.cfg.xmpp.is_some() {
            fronts.spawn(belay_jobs::front::xmpp::run(
                svc.clone(),
                wake.clone(),
                stop.clone(),
            ));
        }
        if svc.cfg.http.is_some() {
            fronts.spawn(belay_jobs::front::http::run(
                svc.clone(),
                wake.clone(),
                stop.clone(),
            ));
        }
        if svc.cfg.drop.is_some() {
            fronts.spawn(belay_jobs::front::drop::run(
                svc.clone(),
                wake.clone(),
                stop.clone(),
            ));
        }
    }
    p.note(&format!(
        "jobs: queue {}, {workers} worker(s){}",
        svc.queue.root().display(),
        if w.once {
            ", until the inbox is empty"
        } else {
            ""
        }
    ));
    let mut workers_task = tokio::spawn(belay_jobs::worker::work(
        svc.clone(),
        workers,
        w.once,
        stop.clone(),
        wake,
    ));
    // A front end that fails (a bad password, a busy port) stops the
    // workers as SIGTERM would: belay does not run deaf.
    let mut front_failed = None;
    let summary = loop {
        tokio::select! {
            r = &mut workers_task => break r,
            Some(f) = fronts.join_next() => {
                if let Ok(Err(e)) = f {
                    p.warn(&format!("a front end stopped: {e}; stopping the workers"));
                    front_failed = Some(e);
                    stop.trip("a front end failed");
                }
            }
        }
    };
    fronts.shutdown().await;
    let s = summary.map_err(|e| infra(format!("the workers stopped: {e}")))??;
    if let Some(e) = front_failed {
        return Err(e.into());
    }
    p.note(&format!(
        "jobs: {} ran, {} interrupted, {} recovered{}",
        s.ran,
        s.interrupted,
        s.recovered,
        if s.failed.is_empty() {
            String::new()
        } else {
            format!(", {} failed", s.failed.len())
        }
    ));
    // A run until the inbox is empty says whether its jobs did what they
    // were asked: a failed one is a failed check (exit 1), with why.
    if w.once && !s.failed.is_empty() {
        for f in &s.failed {
            p.warn(&format!(
                "job {} {}: {}",
                f.id,
                f.status,
                belay_record::printable_line(f.reason.lines().next().unwrap_or_default())
            ));
        }
        return Ok(EXIT_FAILED);
    }
    Ok(0)
}

fn list(p: &Printer, svc: &Services, a: &ListArgs) -> Result<u8, Failure> {
    let json = a.json;
    let mut rows = Vec::new();
    for d in Dir::ALL {
        for f in svc.queue.list(d)? {
            match Queue::read(&f) {
                Ok(j) => rows.push(serde_json::json!({
                    "id": j.id, "state": d.as_str(), "sender": j.sender,
                    "requested_by": j.requester(), "role": j.pipeline_role.as_str(),
                    "preview": j.preview(60), "failure": j.belay.failure,
                })),
                Err(e) => rows.push(serde_json::json!({
                    "id": f.file_stem().map(|s| s.to_string_lossy().into_owned()),
                    "state": d.as_str(), "error": e.to_string(),
                })),
            }
        }
    }
    // The finished jobs: their completion records, but for those still in
    // the queue (a failed job is in failed/ and has a record).
    let queued: std::collections::HashSet<String> = rows
        .iter()
        .filter_map(|r| r["id"].as_str().map(str::to_string))
        .collect();
    let finished: Vec<belay_jobs::record::CompletionRecord> =
        belay_jobs::record::finished(&svc.queue.sub("done"))
            .into_iter()
            .filter(|r| !queued.contains(&r.job_id))
            .collect();
    let waiting = rows.len();
    if a.all {
        rows.extend(finished.iter().map(|r| {
            serde_json::json!({
                "id": r.job_id, "state": "done", "outcome": r.status.as_str(),
                "completed_at": r.completed_at, "role": r.pipeline_role,
                "failure": r.failure_detail,
            })
        }));
    }
    if json {
        p.json(&rows);
        return Ok(0);
    }
    let more = if finished.is_empty() || a.all {
        String::new()
    } else {
        format!("{} finished: `belay jobs list --all`", finished.len())
    };
    if waiting == 0 {
        p.out(match (finished.is_empty(), a.all) {
            (true, _) => "no jobs in the queue".to_string(),
            (false, true) => "no jobs waiting; finished:".to_string(),
            (false, false) => format!("no jobs waiting; {more}"),
        });
    }
    // One row a job: a sender's request body, its name and an error are
    // shown on one line, with no control character of theirs.
    let cell = |v: &serde_json::Value, or: &'static str| {
        belay_record::printable_line(v.as_str().unwrap_or(or)).into_owned()
    };
    for r in rows {
        if r["state"] == "done" {
            // A finished job: its outcome and when.
            p.out(format!(
                "{:<26} {:<10} {:<24} {}",
                cell(&r["id"], "?"),
                cell(&r["state"], "?"),
                cell(&r["outcome"], ""),
                cell(&r["completed_at"], "")
            ));
            continue;
        }
        let last = if r["preview"].is_string() {
            &r["preview"]
        } else {
            &r["error"]
        };
        p.out(format!(
            "{:<26} {:<10} {:<24} {}",
            cell(&r["id"], "?"),
            cell(&r["state"], "?"),
            cell(&r["requested_by"], ""),
            cell(last, "")
        ));
    }
    if waiting > 0 && !more.is_empty() {
        p.out(format!("and {more}"));
    }
    Ok(0)
}

fn show(p: &Printer, svc: &Services, id: &Id, json: bool) -> Result<u8, Failure> {
    let found = svc.queue.find(id);
    let record = fs_err::read_to_string(svc.queue.done_file(id))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let job = found.as_ref().and_then(|(_, f)| Queue::read(f).ok());
    if found.is_none() && record.is_none() {
        return Err(usage(format!(
            "no job {id} in {} (belay jobs list shows the queue)",
            svc.queue.root().display()
        )));
    }
    let v = serde_json::json!({
        "id": id,
        "state": found.as_ref().map(|(d, _)| d.as_str()).unwrap_or("done"),
        "job": job,
        "record": record,
        "run_dir": svc.queue.run_dir(id),
    });
    if json {
        p.json(&v);
    } else {
        p.out(serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    Ok(0)
}
