//! The file drop: a directory where a file becomes a job. A `.json` file
//! carries a job's fields, any other file its body. A file is first moved
//! into the queue (so it is taken once, whatever happens next), read without
//! following links and only up to a size; one that is no valid job goes to
//! the queue's `failed/` with the reason: nothing dropped is lost.
//!
//! Whoever can write the directory asks as `drop`, and waits for an owner's
//! approval, unless `[drop] trusted = true` says the directory is the
//! owner's alone (then its jobs are the owner's, and may say on whose
//! behalf they are). A directory others may write is refused.
//!
//! A file's name is parsed by the one validator of ids before it is used in
//! any path: a name that is no id (spaces, control characters, `..`, not
//! UTF-8) is taken into `failed/` under a name of belay's, with the reason.

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use belay_record::Id;

use crate::job::{Job, Request};
use crate::queue::Dir;
use crate::services::Services;
use crate::worker::Stop;
use crate::{gates, JobsError};

/// The largest file taken.
pub const MAX_DROP_BYTES: u64 = 256 * 1024;
/// The sender of an untrusted directory's jobs.
pub const DROP_SENDER: &str = "drop";

/// The job a dropped file makes (`trusted`: the directory is the owner's).
pub fn job_of(path: &Path, text: &str, trusted: bool) -> Result<Job, JobsError> {
    let sender = if trusted {
        crate::config::LOCAL_SENDER
    } else {
        DROP_SENDER
    };
    let is_json = path.extension().is_some_and(|x| x == "json");
    if !is_json {
        let mut j = Job::new(sender, text);
        j.source = Some("drop".into());
        return Ok(j);
    }
    let mut d: Request = serde_json::from_str(text).map_err(|e| {
        JobsError::Refused(format!(
            "{}:{}:{}: not a valid job: {e}",
            path.display(),
            e.line(),
            e.column()
        ))
    })?;
    let (id, requested_by) = (d.id.take(), d.requested_by.take());
    let mut j = d.into_job(sender, "drop");
    if let Some(id) = id {
        j.id = id;
    }
    match (requested_by, trusted) {
        (None, _) => {}
        (Some(r), true) => j.requested_by = Some(r),
        (Some(_), false) => {
            return Err(JobsError::Refused(format!(
                "{}: `requested_by` is only taken from a trusted drop directory ([drop] trusted = true)",
                path.display()
            )))
        }
    }
    Ok(j)
}

/// Refuse a drop directory others may write.
fn check_dir(dir: &Path) -> Result<(), JobsError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = fs_err::symlink_metadata(dir).map_err(|e| JobsError::io("read", dir, e))?;
    if !m.is_dir() {
        return Err(JobsError::Config(format!(
            "[drop] dir {} is not a directory",
            dir.display()
        )));
    }
    if m.permissions().mode() & 0o022 != 0 || m.uid() != rustix::process::geteuid().as_raw() {
        return Err(JobsError::Config(format!(
            "[drop] dir {} may be written by others than belay's user: make it theirs alone (chmod go-w, chown)",
            dir.display()
        )));
    }
    Ok(())
}

/// A file name not taken in `dir` (`name`, `name.1`, …).
fn free_name(dir: &Path, name: &str) -> std::path::PathBuf {
    let mut p = dir.join(name);
    let mut i = 1;
    while fs_err::symlink_metadata(&p).is_ok() {
        p = dir.join(format!("{name}.{i}"));
        i += 1;
    }
    p
}

/// Read a file taken into `staging` (never through a link, a regular file
/// only, never waiting on a FIFO), at most [`MAX_DROP_BYTES`]: through
/// `hostfs`, the one host read of a file someone else wrote.
fn read_plain(staging: &Path, name: &str) -> Result<String, JobsError> {
    let bytes = belay_sandbox::hostfs::read(staging, name, MAX_DROP_BYTES + 1)
        .map_err(|e| JobsError::Refused(format!("{name}: {e}")))?
        .ok_or_else(|| JobsError::Refused(format!("{name}: it is gone")))?;
    if bytes.len() as u64 > MAX_DROP_BYTES {
        return Err(JobsError::Refused(format!(
            "{name}: more than the {MAX_DROP_BYTES} bytes a request may have"
        )));
    }
    String::from_utf8(bytes)
        .map_err(|e| JobsError::Refused(format!("{name}: not UTF-8 text ({e})")))
}

/// Move `taken` to `failed/` (under a free name like `name`) with the
/// reason beside it.
fn fail(svc: &Services, taken: &Path, name: &str, why: &str) {
    let dest = free_name(&svc.queue.dir(Dir::Failed), name);
    let why = svc.redactor.redact(why).into_owned();
    if fs_err::rename(taken, &dest).is_ok() {
        let mut reason = dest.clone().into_os_string();
        reason.push(".reason");
        let _ = belay_record::atomic_write(Path::new(&reason), format!("{why}\n").as_bytes());
    }
    svc.tell(&crate::events::JobEvent::DropRefused {
        file: name.to_string(),
        reason: why,
    });
}

/// The file names of the drop directory to take (not dot files: others'
/// partial writes), sorted.
fn names(dir: &Path) -> Result<Vec<OsString>, JobsError> {
    // host-owned: the drop directory, a real directory only belay's user may write (`check_dir`); names only, each parsed before use.
    let rd = match fs_err::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(JobsError::io("read", dir, e)),
    };
    let mut names: Vec<OsString> = rd
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !n.as_encoded_bytes().starts_with(b"."))
        .collect();
    names.sort();
    Ok(names)
}

/// Take every file of the drop directory once; how many became jobs.
pub fn sweep(svc: &Services, dir: &Path, trusted: bool) -> Result<usize, JobsError> {
    check_dir(dir)?;
    let names = names(dir)?;
    let staging = svc.queue.sub("dropped");
    fs_err::create_dir_all(&staging).map_err(|e| JobsError::io("create", &staging, e))?;
    let mut n = 0;
    for raw in names {
        // The name, parsed by the one validator; one that is no id is
        // taken under a name of belay's. `raw` is a directory entry's own
        // name (one component, never `.` or `..`): the only use of it is
        // to take that entry.
        let parsed: Result<Id, JobsError> = match raw.to_str() {
            Some(s) => Id::parse("drop file", s).map_err(JobsError::from),
            None => Err(JobsError::Refused(format!(
                "the file name {} is not UTF-8",
                raw.to_string_lossy().escape_debug()
            ))),
        };
        let name = match &parsed {
            Ok(id) => id.to_string(),
            Err(_) => format!("{}.refused", crate::job::new_id()),
        };
        // Into the queue first: taken once, whatever happens next.
        let taken = free_name(&staging, &name);
        if fs_err::rename(dir.join(&raw), &taken).is_err() {
            continue;
        }
        let Some(staged) = taken
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let made = match parsed {
            Err(e) => Err(e),
            Ok(id) => read_plain(&staging, &staged)
                .and_then(|t| job_of(&dir.join(&id), &t, trusted))
                .and_then(|j| gates::submit(svc, j)),
        };
        match made {
            Ok(_) => {
                let _ = fs_err::remove_file(&taken);
                n += 1;
            }
            Err(e) => fail(svc, &taken, &name, &e.to_string()),
        }
    }
    Ok(n)
}

/// Watch the drop directory until `stop`.
pub async fn run(
    svc: Arc<Services>,
    wake: Arc<tokio::sync::Notify>,
    stop: Stop,
) -> Result<(), JobsError> {
    let Some(d) = svc.cfg.drop.clone() else {
        return Ok(());
    };
    if !d.dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&d.dir)
            .map_err(|e| JobsError::io("create", &d.dir, e))?;
    }
    loop {
        if sweep(&svc, &d.dir, d.trusted)? > 0 {
            wake.notify_waiters();
        }
        tokio::select! {
            _ = tokio::time::sleep(d.poll) => {}
            _ = stop.wait() => return Ok(()),
        }
    }
}
