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

use std::path::Path;
use std::sync::Arc;

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

/// Read a regular file (never through a link), at most [`MAX_DROP_BYTES`].
fn read_plain(p: &Path) -> Result<String, JobsError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(
            rustix::fs::OFlags::NOFOLLOW.bits() as i32 | rustix::fs::OFlags::NONBLOCK.bits() as i32,
        )
        .open(p)
        .map_err(|e| {
            JobsError::Refused(format!(
                "{}: cannot open it ({e}); links are not followed",
                p.display()
            ))
        })?;
    let m = f.metadata().map_err(|e| JobsError::io("read", p, e))?;
    if !m.is_file() {
        return Err(JobsError::Refused(format!(
            "{}: not a regular file",
            p.display()
        )));
    }
    if m.len() > MAX_DROP_BYTES {
        return Err(JobsError::Refused(format!(
            "{}: {} bytes, more than the {MAX_DROP_BYTES} a request may have",
            p.display(),
            m.len()
        )));
    }
    let mut s = String::new();
    f.take(MAX_DROP_BYTES)
        .read_to_string(&mut s)
        .map_err(|e| JobsError::Refused(format!("{}: not UTF-8 text ({e})", p.display())))?;
    Ok(s)
}

/// Take every file of the drop directory once; how many became jobs.
pub fn sweep(svc: &Services, dir: &Path, trusted: bool) -> Result<usize, JobsError> {
    check_dir(dir)?;
    let rd = match fs_err::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(JobsError::io("read", dir, e)),
    };
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let staging = svc.queue.sub("dropped");
    fs_err::create_dir_all(&staging).map_err(|e| JobsError::io("create", &staging, e))?;
    let mut n = 0;
    for name in names {
        // Into the queue first: taken once, whatever happens next.
        let taken = free_name(&staging, &name);
        if fs_err::rename(dir.join(&name), &taken).is_err() {
            continue;
        }
        let made = read_plain(&taken)
            .and_then(|t| job_of(&dir.join(&name), &t, trusted))
            .and_then(|j| gates::submit(svc, j));
        match made {
            Ok(_) => {
                let _ = fs_err::remove_file(&taken);
                n += 1;
            }
            Err(e) => {
                let dest = free_name(&svc.queue.dir(Dir::Failed), &name);
                let why = svc.redactor.redact(&e.to_string()).into_owned();
                if fs_err::rename(&taken, &dest).is_ok() {
                    let mut reason = dest.clone().into_os_string();
                    reason.push(".reason");
                    let _ = belay_record::atomic_write(
                        std::path::Path::new(&reason),
                        format!("{why}\n").as_bytes(),
                    );
                }
                (svc.progress)(&format!("drop: {name} is no job: {why}"));
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
