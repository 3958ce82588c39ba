//! The per-repository lock: one agent per repository, whatever config or
//! log dir runs it. It is a kernel lock (released when the holder dies,
//! even by `kill -9`) in belay's state home, keyed on the repository's
//! common git dir, so that two configs, two log dirs or two worktrees of one
//! repository still exclude each other, and the agent (which can write the
//! repository) cannot reach it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::RoundsError;

/// Who holds a repository's lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub config: String,
    pub started_at: String,
    pub identity: Option<belay_record::ProcessIdentity>,
}

pub struct RepoLock {
    _lock: belay_record::RunLock,
    holder: PathBuf,
}

impl Drop for RepoLock {
    fn drop(&mut self) {
        let _ = fs_err::remove_file(&self.holder);
    }
}

/// The lock file of the repository whose common git dir is `git_dir`.
pub fn lock_path(git_dir: &Path) -> PathBuf {
    let canon = fs_err::canonicalize(git_dir).unwrap_or_else(|_| git_dir.to_path_buf());
    let key = hex::encode(&sha2::Sha256::digest(canon.as_os_str().as_encoded_bytes())[..12]);
    belay_record::state_home()
        .join("rounds/locks")
        .join(format!("{key}.lock"))
}

impl RepoLock {
    /// Take the lock at once, or say who holds it (exit 76: retry later).
    pub fn acquire(git_dir: &Path, config: &Path) -> Result<RepoLock, RoundsError> {
        let path = lock_path(git_dir);
        if let Some(d) = path.parent() {
            fs_err::create_dir_all(d).map_err(|e| RoundsError::io("cannot create", d, e))?;
        }
        let holder_path = path.with_extension("holder");
        match belay_record::RunLock::acquire(&path) {
            Ok(lock) => {
                let h = Holder {
                    pid: std::process::id(),
                    config: config.display().to_string(),
                    started_at: belay_record::now_rfc3339(),
                    identity: belay_record::ProcessIdentity::current(),
                };
                let text = serde_json::to_string(&h).unwrap_or_default();
                belay_record::atomic_write(&holder_path, text.as_bytes())?;
                Ok(RepoLock {
                    _lock: lock,
                    holder: holder_path,
                })
            }
            Err(belay_record::RecordError::Locked { .. }) => {
                let who = fs_err::read_to_string(&holder_path)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Holder>(&t).ok())
                    .map(|h| {
                        format!(
                            " (pid {}, config {}, since {})",
                            h.pid, h.config, h.started_at
                        )
                    })
                    .unwrap_or_default();
                Err(RoundsError::Environment(format!(
                    "another belay is running an agent in the repository {}{who}: one agent per repository; wait for its round to end",
                    git_dir.display()
                )))
            }
            Err(e) => Err(e.into()),
        }
    }
}
