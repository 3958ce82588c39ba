//! Branches, worktrees, resets and diffs: what the plan loop, the rounds and
//! the jobs do to a repository between agent turns.

use std::path::{Path, PathBuf};

use crate::{Git, VcsError};

/// How far [`Git::reset`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// Move HEAD only.
    Soft,
    /// Move HEAD and the index; the work tree stays.
    Mixed,
    /// Move HEAD, the index and the work tree (untracked files stay).
    Hard,
}

impl Git {
    /// Refuse a name git would not take as a branch, with git's own reason.
    async fn check_branch_name(&self, name: &str) -> Result<(), VcsError> {
        if name.starts_with('-')
            || !self
                .succeeds(&["check-ref-format", "--branch", name])
                .await?
        {
            return Err(VcsError::BadName(name.to_string()));
        }
        Ok(())
    }

    /// Create branch `name` at `start` (it must not exist yet).
    pub async fn branch_create(&self, name: &str, start: &str) -> Result<(), VcsError> {
        self.check_branch_name(name).await?;
        self.run(&["branch", "--no-track", name, start]).await?;
        Ok(())
    }

    /// Whether branch `name` exists.
    pub async fn branch_exists(&self, name: &str) -> Result<bool, VcsError> {
        self.succeeds(&[
            "show-ref",
            "--verify",
            "--quiet",
            &format!("refs/heads/{name}"),
        ])
        .await
    }

    /// Check out branch `name` in this work tree.
    pub async fn switch(&self, name: &str) -> Result<(), VcsError> {
        self.check_branch_name(name).await?;
        self.run(&["switch", "--quiet", "--no-guess", name]).await?;
        Ok(())
    }

    /// The branch checked out here, or `None` on a detached HEAD.
    pub async fn current_branch(&self) -> Result<Option<String>, VcsError> {
        let f = self
            .run(&["symbolic-ref", "--quiet", "--short", "HEAD"])
            .await;
        match f {
            Ok(s) => Ok(Some(s.trim().to_string())),
            Err(VcsError::Failed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reset HEAD (and, by `mode`, the index and work tree) to `rev`.
    pub async fn reset(&self, mode: Reset, rev: &str) -> Result<(), VcsError> {
        let flag = match mode {
            Reset::Soft => "--soft",
            Reset::Mixed => "--mixed",
            Reset::Hard => "--hard",
        };
        self.run(&["reset", "--quiet", flag, rev, "--"]).await?;
        Ok(())
    }

    /// The patch from `from` to `to` (the work tree when `to` is `None`).
    /// External diff and textconv drivers never run.
    pub async fn diff(&self, from: &str, to: Option<&str>) -> Result<String, VcsError> {
        let mut args = vec!["diff", "--binary", from];
        args.extend(to);
        args.push("--");
        self.run(&args).await
    }

    /// Put the paths `pathspecs` (git pathspecs, `:(literal)…`, `:(exclude)…`)
    /// back as HEAD has them, in the index and the work tree.
    pub async fn restore_from_head(&self, pathspecs: &[&str]) -> Result<(), VcsError> {
        let mut args = vec!["restore", "--source=HEAD", "--staged", "--worktree", "--"];
        args.extend(pathspecs);
        self.run(&args).await.map(|_| ())
    }

    /// Whether HEAD holds the file `rel`.
    pub async fn in_head(&self, rel: &str) -> Result<bool, VcsError> {
        let spec = format!(":(literal){rel}");
        let out = self
            .run(&["ls-tree", "-r", "--name-only", "HEAD", "--", &spec])
            .await?;
        Ok(!out.trim().is_empty())
    }

    /// The paths that differ between `from` and `to`.
    pub async fn diff_names(&self, from: &str, to: &str) -> Result<Vec<String>, VcsError> {
        let out = self
            .run(&["diff", "--name-only", "-z", "--no-renames", from, to, "--"])
            .await?;
        Ok(out
            .split('\0')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Add a worktree at `path`: on a new branch `branch` made at `start`, or
    /// detached at `start` when `branch` is `None`. The worktree is opened
    /// with the same hooks directory and deadline.
    pub async fn worktree_add(
        &self,
        path: &Path,
        branch: Option<&str>,
        start: &str,
    ) -> Result<Git, VcsError> {
        let p = path.to_string_lossy();
        let mut args = vec!["worktree", "add", "--quiet"];
        match branch {
            Some(b) => {
                self.check_branch_name(b).await?;
                args.extend(["-b", b]);
            }
            None => args.push("--detach"),
        }
        args.extend(["--", &p, start]);
        self.run(&args).await?;
        Ok(Git::open(path, &self.hooks)
            .await?
            .with_timeout(self.timeout)
            .with_remote_env(self.remote_env.clone())
            .with_credential_helper(self.credential_helper.clone()))
    }

    /// Remove the worktree at `path`; `force` removes it with changes in it.
    pub async fn worktree_remove(&self, path: &Path, force: bool) -> Result<(), VcsError> {
        let p = path.to_string_lossy();
        let mut args = vec!["worktree", "remove"];
        if force {
            args.push("--force");
        }
        args.extend(["--", &p]);
        self.run(&args).await?;
        Ok(())
    }

    /// Forget worktrees whose directories are gone.
    pub async fn worktree_prune(&self) -> Result<(), VcsError> {
        self.run(&["worktree", "prune"]).await?;
        Ok(())
    }

    /// The work trees of this repository, the main one first.
    pub async fn worktrees(&self) -> Result<Vec<PathBuf>, VcsError> {
        let out = self.run(&["worktree", "list", "--porcelain", "-z"]).await?;
        Ok(out
            .split('\0')
            .filter_map(|l| l.strip_prefix("worktree "))
            .map(PathBuf::from)
            .collect())
    }
}
