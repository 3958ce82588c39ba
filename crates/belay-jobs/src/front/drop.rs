//! The file drop: a directory of the owner's where a file becomes a job. A
//! `.json` file carries a job's fields (`id` and `sender` optional), any
//! other file its body. A file that is no valid job goes to the queue's
//! `failed/` with the reason: nothing dropped is lost.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::job::{Job, Role};
use crate::queue::Dir;
use crate::services::Services;
use crate::worker::Stop;
use crate::{gates, JobsError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Dropped {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    sender: Option<String>,
    #[serde(default)]
    requested_by: Option<String>,
    body: String,
    #[serde(default)]
    repos: Vec<String>,
    #[serde(default)]
    runtime: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    reasoning_effort: Option<String>,
    #[serde(default)]
    iteration_limit: Option<u32>,
    #[serde(default)]
    pipeline_role: Option<Role>,
    #[serde(default)]
    on_complete_dir: Option<std::path::PathBuf>,
    #[serde(default)]
    board_slug: Option<String>,
    #[serde(default)]
    pipeline_run_id: Option<String>,
    #[serde(default)]
    fresh_session: bool,
}

/// The job a dropped file makes.
pub fn job_of(path: &Path, text: &str) -> Result<Job, JobsError> {
    let is_json = path.extension().is_some_and(|x| x == "json");
    if !is_json {
        let mut j = Job::new(crate::config::LOCAL_SENDER, text);
        j.source = Some("drop".into());
        return Ok(j);
    }
    let d: Dropped = serde_json::from_str(text).map_err(|e| {
        JobsError::Refused(format!(
            "{}:{}:{}: not a valid job: {e}",
            path.display(),
            e.line(),
            e.column()
        ))
    })?;
    let mut j = Job::new(
        d.sender.as_deref().unwrap_or(crate::config::LOCAL_SENDER),
        &d.body,
    );
    if let Some(id) = d.id {
        j.id = id;
    }
    j.requested_by = d.requested_by;
    j.repos = d.repos;
    j.runtime = d.runtime;
    j.agent = d.agent;
    j.model = d.model;
    j.reasoning_effort = d.reasoning_effort;
    j.iteration_limit = d.iteration_limit;
    j.pipeline_role = d.pipeline_role.unwrap_or_default();
    j.on_complete_dir = d.on_complete_dir;
    j.board_slug = d.board_slug;
    j.pipeline_run_id = d.pipeline_run_id;
    j.fresh_session = d.fresh_session;
    j.source = Some("drop".into());
    Ok(j)
}

/// Take every file of the drop directory once; how many became jobs.
pub fn sweep(svc: &Services, dir: &Path) -> Result<usize, JobsError> {
    let rd = match fs_err::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(JobsError::io("read", dir, e)),
    };
    let mut files: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    let mut n = 0;
    for p in files {
        let made = fs_err::read_to_string(&p)
            .map_err(|e| JobsError::io("read", &p, e))
            .and_then(|t| job_of(&p, &t))
            .and_then(|j| gates::submit(svc, j));
        match made {
            Ok(_) => {
                let _ = fs_err::remove_file(&p);
                n += 1;
            }
            Err(e) => {
                // Into the queue's failed/, with the reason.
                let dest = svc.queue.dir(Dir::Failed).join(
                    p.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| "dropped".into()),
                );
                if fs_err::rename(&p, &dest).is_ok() {
                    let _ = belay_record::atomic_write(
                        &dest.with_extension(format!(
                            "{}.reason",
                            dest.extension()
                                .map(|x| x.to_string_lossy().into_owned())
                                .unwrap_or_default()
                        )),
                        format!("{e}\n").as_bytes(),
                    );
                }
                (svc.progress)(&format!("drop: {} is no job: {e}", p.display()));
            }
        }
    }
    Ok(n)
}

/// Watch the drop directory until `stop`.
pub async fn run(
    svc: Arc<Services>,
    wake: Arc<tokio::sync::Notify>,
    mut stop: Stop,
) -> Result<(), JobsError> {
    let Some(d) = svc.cfg.drop.clone() else {
        return Ok(());
    };
    fs_err::create_dir_all(&d.dir).map_err(|e| JobsError::io("create", &d.dir, e))?;
    loop {
        if sweep(&svc, &d.dir)? > 0 {
            wake.notify_waiters();
        }
        tokio::select! {
            _ = tokio::time::sleep(d.poll) => {}
            _ = stop.wait() => return Ok(()),
        }
    }
}
