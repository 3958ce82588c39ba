//! Stashes named by their commit SHA, never by a position in the stash list
//! (which shifts whenever anything else stashes).

use crate::{Git, VcsError};

/// One entry of the stash list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stash {
    pub sha: String,
    pub message: String,
}

/// A pathspec of the whole tree except the paths `keep` (relative to the
/// root, taken literally); empty when nothing is kept.
pub fn keep_pathspec(keep: &[String]) -> Vec<String> {
    if keep.is_empty() {
        return Vec::new();
    }
    std::iter::once(":/".to_string())
        .chain(keep.iter().map(|k| format!(":(exclude,literal){k}")))
        .collect()
}

impl Git {
    /// Stash every change (tracked, staged and untracked; ignored files stay),
    /// leaving the work tree at HEAD. The stash's SHA, or `None` when the tree
    /// was clean.
    pub async fn stash_push(&self, message: &str) -> Result<Option<String>, VcsError> {
        self.stash_push_except(message, &[]).await
    }

    /// [`Git::stash_push`], leaving the paths `keep` (relative to the root)
    /// as they are: a supervisor's own inputs in the tree (its config, the
    /// prompt) are not the agent's work.
    pub async fn stash_push_except(
        &self,
        message: &str,
        keep: &[String],
    ) -> Result<Option<String>, VcsError> {
        let spec = keep_pathspec(keep);
        let spec: Vec<&str> = spec.iter().map(String::as_str).collect();
        if self.dirty(&spec).await?.is_empty() {
            return Ok(None);
        }
        let before = self.stash_top().await?;
        let mut args = vec![
            "stash",
            "push",
            "--quiet",
            "--include-untracked",
            "--message",
            message,
        ];
        if !spec.is_empty() {
            args.push("--");
            args.extend(spec.iter().copied());
        }
        self.run(&args).await?;
        let after = self.stash_top().await?;
        if after == before {
            return Ok(None);
        }
        Ok(after)
    }

    /// A stash commit of the tracked changes, made without touching the work
    /// tree or the stash list (`git stash create`); `None` when clean.
    pub async fn stash_create(&self, message: &str) -> Result<Option<String>, VcsError> {
        let sha = self.run(&["stash", "create", message]).await?;
        let sha = sha.trim();
        Ok((!sha.is_empty()).then(|| sha.to_string()))
    }

    /// Record the stash commit `sha` in the stash list, so gc keeps it.
    pub async fn stash_store(&self, sha: &str, message: &str) -> Result<(), VcsError> {
        self.run(&["stash", "store", "--quiet", "--message", message, sha])
            .await?;
        Ok(())
    }

    /// Apply the stash `sha` to the work tree (it stays in the list).
    pub async fn stash_apply(&self, sha: &str) -> Result<(), VcsError> {
        self.run(&["stash", "apply", "--quiet", sha]).await?;
        Ok(())
    }

    /// Drop the stash `sha` from the list, wherever it stands in it.
    pub async fn stash_drop(&self, sha: &str) -> Result<(), VcsError> {
        let Some(i) = self.stash_list().await?.iter().position(|s| s.sha == sha) else {
            return Err(VcsError::NoSuchStash(sha.to_string()));
        };
        self.run(&["stash", "drop", "--quiet", &format!("stash@{{{i}}}")])
            .await?;
        Ok(())
    }

    /// The stash list, newest first.
    pub async fn stash_list(&self) -> Result<Vec<Stash>, VcsError> {
        if self.stash_top().await?.is_none() {
            return Ok(Vec::new());
        }
        let out = self
            .run(&["log", "-g", "-z", "--format=%H %gs", "refs/stash", "--"])
            .await?;
        Ok(out
            .split('\0')
            .filter_map(|e| e.trim_start_matches('\n').split_once(' '))
            .map(|(sha, m)| Stash {
                sha: sha.to_string(),
                message: m.to_string(),
            })
            .collect())
    }

    async fn stash_top(&self) -> Result<Option<String>, VcsError> {
        self.resolve_commit("refs/stash").await
    }
}
