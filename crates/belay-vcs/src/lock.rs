//! The per-repository lock: one writer of a repository's main checkout at a
//! time, whichever mode (a round, a job's stash of foreign changes) and
//! whichever config, log dir, queue or worktree it comes from.
//!
//! It is a kernel lock (released when the holder dies, even by `kill -9`) in
//! belay's state home, keyed on the repository's canonical common git dir, so
//! that two worktrees of one repository still exclude each other, and an
//! agent (which can write the repository) cannot reach it. Beside the lock, a
//! holder file says who holds it, for the message of the one who waits.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::VcsError;

/// Who holds a repository's lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    /// What holds it (a config path, `job <id>`).
    #[serde(alias = "config")]
    pub what: String,
    pub started_at: String,
    pub identity: Option<belay_record::ProcessIdentity>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {}, {}, since {}",
            self.pid, self.what, self.started_at
        )
    }
}

/// A held repository lock; dropping it releases it.
#[derive(Debug)]
pub struct RepoLock {
    _lock: belay_record::RunLock,
    holder: PathBuf,
}

impl Drop for RepoLock {
    fn drop(&mut self) {
        let _ = fs_err::remove_file(&self.holder);
    }
}

/// The lock file of the repository whose common git dir is `common_dir`.
pub fn lock_path(common_dir: &Path) -> PathBuf {
    let canon = fs_err::canonicalize(common_dir).unwrap_or_else(|_| common_dir.to_path_buf());
    let key = hex::encode(&sha2::Sha256::digest(canon.as_os_str().as_encoded_bytes())[..12]);
    belay_record::state_home()
        .join("locks/repos")
        .join(format!("{key}.lock"))
}

impl RepoLock {
    /// Take the lock at once, or fail with [`VcsError::Locked`] naming the
    /// holder.
    pub fn try_acquire(common_dir: &Path, what: &str) -> Result<RepoLock, VcsError> {
        let path = lock_path(common_dir);
        if let Some(d) = path.parent() {
            fs_err::create_dir_all(d).map_err(|e| VcsError::io("create", d, e))?;
        }
        let holder_path = path.with_extension("holder");
        match belay_record::RunLock::acquire(&path) {
            Ok(lock) => {
                let h = Holder {
                    pid: std::process::id(),
                    what: what.to_string(),
                    started_at: belay_record::now_rfc3339(),
                    identity: belay_record::ProcessIdentity::current(),
                };
                let text = serde_json::to_string(&h).unwrap_or_default();
                belay_record::atomic_write(&holder_path, text.as_bytes())
                    .map_err(|e| VcsError::Record(e.to_string()))?;
                Ok(RepoLock {
                    _lock: lock,
                    holder: holder_path,
                })
            }
            Err(belay_record::RecordError::Locked { .. }) => Err(VcsError::Locked {
                repo: common_dir.to_path_buf(),
                holder: fs_err::read_to_string(&holder_path)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Holder>(&t).ok())
                    .map(|h| h.to_string())
                    .unwrap_or_else(|| "another belay".into()),
            }),
            Err(e) => Err(VcsError::Record(e.to_string())),
        }
    }

    /// Take the lock, waiting up to `wait` for its holder to let go.
    pub async fn acquire(
        common_dir: &Path,
        what: &str,
        wait: Duration,
    ) -> Result<RepoLock, VcsError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match Self::try_acquire(common_dir, what) {
                Err(VcsError::Locked { .. }) if start.elapsed() < wait => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    /// The locks of several repositories, taken in the order of their lock
    /// files (so that two takers of overlapping sets never deadlock); one
    /// repository named twice is locked once.
    pub async fn acquire_sorted(
        common_dirs: &[PathBuf],
        what: &str,
        wait: Duration,
    ) -> Result<Vec<RepoLock>, VcsError> {
        let mut keyed: Vec<(PathBuf, &PathBuf)> =
            common_dirs.iter().map(|d| (lock_path(d), d)).collect();
        keyed.sort();
        keyed.dedup_by(|a, b| a.0 == b.0);
        let mut held = Vec::with_capacity(keyed.len());
        for (_, dir) in keyed {
            held.push(Self::acquire(dir, what, wait).await?);
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_lock_names_its_holder_and_is_free_once_dropped() {
        let home = tempfile::tempdir().unwrap();
        // SAFETY-free: the state home is read per call; one test sets it.
        std::env::set_var("BELAY_STATE_HOME", home.path());
        let repo = tempfile::tempdir().unwrap();
        let first = RepoLock::try_acquire(repo.path(), "job j1").unwrap();
        let e = RepoLock::try_acquire(repo.path(), "job j2").unwrap_err();
        assert!(e.to_string().contains("job j1"), "{e}");
        let waited = RepoLock::acquire(repo.path(), "job j2", Duration::from_millis(100)).await;
        assert!(matches!(waited, Err(VcsError::Locked { .. })));
        drop(first);
        let other = tempfile::tempdir().unwrap();
        let both = RepoLock::acquire_sorted(
            &[other.path().into(), repo.path().into(), repo.path().into()],
            "job j3",
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert_eq!(both.len(), 2);
    }
}
