//! The queue on disk. Job files move `inbox/ → processing/ →` (removed when
//! done | `failed/`); a third party's job waits in `pending/` for the start
//! approval, a finished job in `held/` for the commit approval.
//!
//! A worker claims a job by taking its claim lock (a kernel lock, released
//! when the worker dies) and then renaming it from the inbox: the rename is
//! atomic, so of several workers (in one process or many) exactly one gets
//! it, and a job in `processing/` whose claim lock is free has no live
//! worker. Every file is written atomically, and a new one never replaces
//! another.
//!
//! A job's files are named by its [`Id`] only: every path of a job is made
//! here from an id the one validator parsed, never from text that came from
//! outside.

use std::path::{Path, PathBuf};

use belay_record::Id;
use serde::{Deserialize, Serialize};

use crate::job::Job;
use crate::JobsError;

/// The queue's directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    Inbox,
    Processing,
    Failed,
    /// Waiting for the owner's start approval.
    Pending,
    /// Finished, waiting for the owner's commit approval.
    Held,
}

impl Dir {
    pub const ALL: [Dir; 5] = [
        Dir::Inbox,
        Dir::Processing,
        Dir::Pending,
        Dir::Held,
        Dir::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Dir::Inbox => "inbox",
            Dir::Processing => "processing",
            Dir::Failed => "failed",
            Dir::Pending => "pending",
            Dir::Held => "held",
        }
    }
}

/// A claimed job: the worker holds its claim lock until this is dropped.
#[derive(Debug)]
pub struct Claim {
    pub job: Job,
    pub path: PathBuf,
    _lock: belay_record::RunLock,
}

/// What recovery did with a job left in `processing/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    Requeued(String),
    Failed(String),
}

/// The id a job file's name gives, if it is one (an id, and a run id).
fn id_of_stem(stem: &str) -> Option<Id> {
    Id::parse("job", stem)
        .ok()
        .filter(|id| belay_record::run_id::validate(id.as_str()).is_ok())
}

#[derive(Debug, Clone)]
pub struct Queue {
    root: PathBuf,
}

fn mkdir(d: &Path) -> Result<(), JobsError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(d)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(JobsError::io("create", d, e)),
    }
}

impl Queue {
    /// Open (and make) the queue at `root`.
    pub fn open(root: &Path) -> Result<Queue, JobsError> {
        let q = Queue {
            root: root.to_path_buf(),
        };
        for d in Dir::ALL {
            mkdir(&q.dir(d))?;
        }
        for d in [
            "claims",
            "runs",
            "done",
            "contexts",
            "outbox",
            "worktrees",
            "hooks",
            "dropped",
        ] {
            mkdir(&root.join(d))?;
        }
        Ok(q)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir(&self, d: Dir) -> PathBuf {
        self.root.join(d.as_str())
    }

    /// A queue directory of belay's own (`runs`, `done`, `outbox`, …).
    pub fn sub(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn run_dir(&self, id: &Id) -> PathBuf {
        self.root.join("runs").join(id)
    }

    fn file(&self, d: Dir, id: &Id) -> PathBuf {
        self.dir(d).join(format!("{id}.json"))
    }

    /// The completion record in `done/` (a job without its own
    /// `on_complete_dir`).
    pub fn done_file(&self, id: &Id) -> PathBuf {
        self.sub("done").join(format!("{id}.json"))
    }

    /// A held change's commit message and stashes.
    pub fn held_file(&self, id: &Id) -> PathBuf {
        self.dir(Dir::Held).join(format!("{id}.held"))
    }

    /// The job's claim lock.
    pub fn claim_file(&self, id: &Id) -> PathBuf {
        self.sub("claims").join(format!("{id}.lock"))
    }

    /// Where the job's worktrees are while it runs.
    pub fn worktrees_of(&self, id: &Id) -> PathBuf {
        self.sub("worktrees").join(id)
    }

    /// The job files of `d`, oldest id first (dot files are others' partial
    /// writes, and are skipped).
    pub fn list(&self, d: Dir) -> Result<Vec<PathBuf>, JobsError> {
        let dir = self.dir(d);
        let mut out = Vec::new();
        // host-owned: a directory of the queue (0700, belay's own).
        let rd = fs_err::read_dir(&dir).map_err(|e| JobsError::io("read", &dir, e))?;
        for e in rd.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            out.push(e.path());
        }
        out.sort();
        Ok(out)
    }

    /// How many jobs run or wait to run before `id`, which waits in the
    /// inbox: those processing and those older in the inbox. `None` when it
    /// is not in the inbox (a worker took it already).
    pub fn ahead_of(&self, id: &Id) -> Option<usize> {
        let inbox = self.list(Dir::Inbox).unwrap_or_default();
        let mine = format!("{id}.json");
        let pos = inbox
            .iter()
            .position(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == mine))?;
        let running = self.list(Dir::Processing).map(|l| l.len()).unwrap_or(0);
        Some(running + pos)
    }

    /// Where the job `id` is, if anywhere (a regular file, not a link).
    pub fn find(&self, id: &Id) -> Option<(Dir, PathBuf)> {
        Dir::ALL
            .into_iter()
            .map(|d| (d, self.file(d, id)))
            .find(|(_, p)| fs_err::symlink_metadata(p).is_ok_and(|m| m.is_file()))
    }

    /// Read the job at `path`.
    pub fn read(path: &Path) -> Result<Job, JobsError> {
        // host-owned: a job file of the queue (0700; a file there is the owner's job).
        let text = fs_err::read_to_string(path).map_err(|e| JobsError::io("read", path, e))?;
        Job::parse(path, &text)
    }

    /// Write a new job into `d`; refused if its id is anywhere in the queue.
    pub fn add(&self, d: Dir, job: &Job) -> Result<PathBuf, JobsError> {
        if let Some((at, _)) = self.find(&job.id) {
            return Err(JobsError::Queued {
                id: job.id.clone(),
                at: at.as_str(),
            });
        }
        // A finished job's id is taken too: its run and record stay.
        if self.run_dir(&job.id).exists() || self.done_file(&job.id).exists() {
            return Err(JobsError::Spent { id: job.id.clone() });
        }
        let path = self.file(d, &job.id);
        write_new(&path, job)?;
        Ok(path)
    }

    /// Write `job` (changed) into `to` and remove it from `from`: the new
    /// file lands before the old goes, so a crash between leaves the job
    /// twice, never lost (recovery keeps the later one).
    pub fn relocate(&self, from: &Path, to: Dir, job: &Job) -> Result<PathBuf, JobsError> {
        let dest = self.file(to, &job.id);
        let text = serde_json::to_vec_pretty(job)
            .map_err(|e| JobsError::Environment(format!("cannot encode job {}: {e}", job.id)))?;
        belay_record::atomic_write(&dest, &text)?;
        if from != dest {
            match fs_err::remove_file(from) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(JobsError::io("remove", from, e)),
            }
        }
        Ok(dest)
    }

    /// Rewrite a job in place.
    pub fn save(&self, path: &Path, job: &Job) -> Result<(), JobsError> {
        let text = serde_json::to_vec_pretty(job)
            .map_err(|e| JobsError::Environment(format!("cannot encode job {}: {e}", job.id)))?;
        belay_record::atomic_write(path, &text)?;
        Ok(())
    }

    fn claim_lock(&self, id: &Id) -> Result<Option<belay_record::RunLock>, JobsError> {
        let p = self.claim_file(id);
        match belay_record::RunLock::acquire(&p) {
            Ok(l) => Ok(Some(l)),
            Err(belay_record::RecordError::Locked { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The job's lock for a gate (accept, decline, approve, discard,
    /// requeue): one gate at a time per job, and no gate on a job a worker
    /// runs. An approval holds it while it commits, so a start-up recovery
    /// leaves it alone.
    pub fn gate_lock(&self, id: &Id) -> Result<belay_record::RunLock, JobsError> {
        match self.claim_lock(id)? {
            Some(l) => Ok(l),
            None => Err(JobsError::Busy { id: id.clone() }),
        }
    }

    /// The job's lock if it is free (nobody runs it or gates it).
    pub fn try_lock_job(&self, id: &Id) -> Result<Option<belay_record::RunLock>, JobsError> {
        self.claim_lock(id)
    }

    /// Claim the oldest job of the inbox, if there is one. A file that is no
    /// valid job goes to `failed/` with the reason beside it.
    pub fn claim(&self) -> Result<Option<Claim>, JobsError> {
        for path in self.list(Dir::Inbox)? {
            let Some(stem) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
                continue;
            };
            let Some(id) = id_of_stem(&stem) else {
                self.reject(
                    &path,
                    &format!(
                        "the file name `{}.json` is no job id (1-64 letters, digits, '-', '_', '.', starting with a letter or digit, no '..')",
                        stem.escape_debug()
                    ),
                )?;
                continue;
            };
            let Some(lock) = self.claim_lock(&id)? else {
                continue;
            };
            let dest = self.file(Dir::Processing, &id);
            match fs_err::rename(&path, &dest) {
                Ok(()) => {}
                // Another worker was first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(JobsError::io("claim", &path, e)),
            }
            let job = match Self::read(&dest) {
                Ok(j) if j.id == id => j,
                Ok(j) => {
                    self.reject(
                        &dest,
                        &format!("the job's id `{}` is not its file name `{stem}`", j.id),
                    )?;
                    continue;
                }
                Err(e) => {
                    self.reject(&dest, &e.to_string())?;
                    continue;
                }
            };
            return Ok(Some(Claim {
                job,
                path: dest,
                _lock: lock,
            }));
        }
        Ok(None)
    }

    /// Move a file that is no valid job to `failed/`, with `<name>.reason`.
    pub fn reject(&self, path: &Path, why: &str) -> Result<(), JobsError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "job.json".into());
        let dest = self.dir(Dir::Failed).join(&name);
        fs_err::rename(path, &dest).map_err(|e| JobsError::io("move to failed/", path, e))?;
        belay_record::atomic_write(
            &self.dir(Dir::Failed).join(format!("{name}.reason")),
            format!("{why}\n").as_bytes(),
        )?;
        tracing::warn!("{}: {why}", dest.display());
        Ok(())
    }

    /// Jobs left in `processing/` with no live worker (belay was killed):
    /// requeued once, then failed.
    pub fn recover(&self) -> Result<Vec<(Job, Recovered)>, JobsError> {
        let mut out = Vec::new();
        for path in self.list(Dir::Processing)? {
            let Some(stem) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
                continue;
            };
            let Some(id) = id_of_stem(&stem) else {
                continue;
            };
            let Some(_lock) = self.claim_lock(&id)? else {
                continue; // a live worker has it
            };
            let mut job = match Self::read(&path) {
                Ok(j) => j,
                Err(e) => {
                    self.reject(&path, &e.to_string())?;
                    continue;
                }
            };
            if job.belay.requeues == 0 {
                job.belay.requeues = 1;
                self.relocate(&path, Dir::Inbox, &job)?;
                out.push((
                    job.clone(),
                    Recovered::Requeued(format!(
                        "job {} was found in processing/ with no live worker (belay was killed mid-job); it is back in the inbox, once",
                        job.id
                    )),
                ));
            } else {
                let why = format!(
                    "job {} was found in processing/ with no live worker a second time; it is not run again (`belay jobs requeue {}` tries once more)",
                    job.id, job.id
                );
                job.belay.failure = Some(why.clone());
                self.relocate(&path, Dir::Failed, &job)?;
                out.push((job, Recovered::Failed(why)));
            }
        }
        Ok(out)
    }
}

/// Write `path` only if nothing is there: a temp file, then a hard link
/// (which fails on an existing name), then the temp file goes.
pub fn write_new<T: Serialize>(path: &Path, value: &T) -> Result<(), JobsError> {
    let text = serde_json::to_vec_pretty(value)
        .map_err(|e| JobsError::Environment(format!("cannot encode {}: {e}", path.display())))?;
    let tmp = path.with_file_name(format!(
        ".{}.new.{}.{:08x}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id(),
        fastrand::u32(..)
    ));
    belay_record::atomic_write(&tmp, &text)?;
    let linked = fs_err::hard_link(&tmp, path);
    let _ = fs_err::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(JobsError::Exists {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(JobsError::io("write", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str) -> Job {
        let mut j = Job::new("local", "do it");
        j.id = Id::parse("job", id).unwrap();
        j
    }

    #[test]
    fn one_claim_per_job_and_malformed_files_fail_with_a_reason() {
        let d = tempfile::tempdir().unwrap();
        let q = Queue::open(d.path()).unwrap();
        q.add(Dir::Inbox, &job("a1")).unwrap();
        assert!(q.add(Dir::Pending, &job("a1")).is_err());
        fs_err::write(q.dir(Dir::Inbox).join("b2.json"), "{ not json").unwrap();
        fs_err::write(q.dir(Dir::Inbox).join(".c3.json.tmp"), "{}").unwrap();
        let c = q.claim().unwrap().unwrap();
        assert_eq!(c.job.id.as_str(), "a1");
        // b2 is malformed: failed with a reason; the temp file stays.
        assert!(q.claim().unwrap().is_none());
        let reason = fs_err::read_to_string(q.dir(Dir::Failed).join("b2.json.reason")).unwrap();
        assert!(reason.contains("b2.json:1:"), "{reason}");
        assert!(q.dir(Dir::Inbox).join(".c3.json.tmp").exists());
        // A live claim is not an orphan; a dropped one is, once.
        assert!(q.recover().unwrap().is_empty());
        drop(c);
        let r = q.recover().unwrap();
        assert!(matches!(r[0].1, Recovered::Requeued(_)));
        let c = q.claim().unwrap().unwrap();
        assert_eq!(c.job.belay.requeues, 1);
        drop(c);
        let r = q.recover().unwrap();
        assert!(matches!(r[0].1, Recovered::Failed(_)));
        assert_eq!(
            q.find(&Id::parse("job", "a1").unwrap()).unwrap().0,
            Dir::Failed
        );
    }
}
