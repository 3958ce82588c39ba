//! What the agent must not leave changed: the git dir (see
//! [`belay_vcs::GitDirGuard`]) and the supervisor's own inputs in the work
//! tree (the config and the prompt files, which the agent can write: an
//! edited config would run its command, or `placement = "host"`, at the next
//! start). The git dir's record is taken before the agent and kept in the log
//! dir (so that the next start can apply it when belay was killed mid-round);
//! the inputs are put back from belay's trusted copies
//! ([`crate::trusted::Trust`]), never from what was on disk at the round's
//! start. Applied once the agent's processes are gone.

use serde::{Deserialize, Serialize};

use crate::events::RoundEvent;
use crate::supervisor::Supervisor;
use crate::RoundsError;

/// The guard of the running round, in the log dir. Still there at a start:
/// belay was killed during a round, whose agent could write the work tree.
pub const GUARD_FILE: &str = "round-guard.json";

#[derive(Serialize, Deserialize)]
pub struct RoundGuard {
    git: belay_vcs::GitDirGuard,
}

impl Supervisor {
    pub(super) fn take_guard(&self) -> Result<RoundGuard, RoundsError> {
        let g = RoundGuard {
            git: self.git.guard_git_dir(),
        };
        let path = self.log_dir().join(GUARD_FILE);
        let text = serde_json::to_vec(&g)
            .map_err(|e| RoundsError::io("cannot encode", &path, std::io::Error::other(e)))?;
        belay_record::atomic_write(&path, &text)?;
        Ok(g)
    }

    fn load_guard(&self) -> Option<RoundGuard> {
        // host-owned: the guard record in the log dir, belay's own.
        let b = fs_err::read(self.log_dir().join(GUARD_FILE)).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// Put back what the agent changed; record what that was. A git dir that
    /// cannot be checked stops the loop: no host git runs on it. The guard
    /// file stays until everything is put back.
    pub(super) fn apply_guard(
        &self,
        g: &RoundGuard,
        round_num: u64,
        step: &str,
    ) -> Result<(), RoundsError> {
        self.restore_control(round_num, step)?;
        let r = g.git.restore().map_err(|e| {
            self.emit(
                Some(step),
                &RoundEvent::GitDirUnchecked {
                    round_num,
                    error: e.to_string(),
                },
            );
            RoundsError::Breaker(e.to_string())
        })?;
        if !r.is_empty() {
            self.emit(
                Some(step),
                &RoundEvent::GitDirRepaired {
                    round_num,
                    restored: r.restored,
                    links_removed: r.links_removed,
                    modes_cleared: r.modes_cleared,
                    locks_removed: r.locks_removed,
                    specials_removed: r.specials_removed,
                },
            );
        }
        let _ = fs_err::remove_file(self.log_dir().join(GUARD_FILE));
        Ok(())
    }

    /// Put back the config and the prompt files in the work tree from the
    /// trusted copies; a file that cannot be put back is an error (the guard
    /// stays, and the next start refuses the file if it is still changed).
    fn restore_control(&self, round_num: u64, step: &str) -> Result<(), RoundsError> {
        let changes = self.trust.put_back(&self.cfg)?;
        if changes.is_empty() {
            return Ok(());
        }
        let paths: Vec<String> = changes.into_iter().map(|c| c.rel).collect();
        self.emit(
            Some(step),
            &RoundEvent::ControlFileRestored { round_num, paths },
        );
        Ok(())
    }

    /// A guard a round left in the log dir (belay was killed during it):
    /// applied, then removed. One that does not load still has the inputs
    /// put back.
    pub(super) fn settle_guard(&self, round_num: u64, step: &str) -> Result<(), RoundsError> {
        let path = self.log_dir().join(GUARD_FILE);
        if fs_err::symlink_metadata(&path).is_err() {
            return Ok(());
        }
        match self.load_guard() {
            Some(g) => self.apply_guard(&g, round_num, step),
            None => {
                self.restore_control(round_num, step)?;
                let _ = fs_err::remove_file(&path);
                Ok(())
            }
        }
    }
}

impl Supervisor {
    /// Move aside the repository of every submodule the agent committed this
    /// round: a gitlink plus `.gitmodules` and a repository at its path whose
    /// config sets `core.fsmonitor` (or hooks) runs on the user's plain `git
    /// status` in the outer tree, as root.
    pub(super) async fn quarantine_new_submodules(
        &self,
        before: Option<&str>,
        round_num: u64,
        step: &str,
    ) {
        let links = match self.git.gitlinks_added(before).await {
            Ok(l) if l.is_empty() => return,
            Ok(l) => l,
            Err(e) => {
                self.warn(format!(
                    "cannot list the submodules the agent committed ({e}); a repository it left in the tree could run its config on your git status: check the tree's nested .git directories before you run git in it"
                ));
                return;
            }
        };
        let root = self.git.root().to_path_buf();
        let mut moved = Vec::new();
        for rel in links {
            match belay_sandbox::hostfs::quarantine_git(&root, &rel) {
                Ok(Some(to)) => moved.push(to),
                Ok(None) => {}
                Err(e) => self.warn(format!(
                    "cannot move aside the repository at {rel}: {e}; do not run git in this tree before you inspect {rel}/.git"
                )),
            }
        }
        if !moved.is_empty() {
            self.emit(
                Some(step),
                &RoundEvent::RepositoryQuarantined { round_num, moved },
            );
        }
    }
}
