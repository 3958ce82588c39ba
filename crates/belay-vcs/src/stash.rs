//! Stashes named by their commit SHA, never by a position in the stash list
//! (which shifts whenever anything else stashes).

use crate::{Git, VcsError};

/// One entry of the stash list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stash {
    pub sha: String,
    pub message: String,
}

impl Git {
    /// Stash every change (tracked, staged and untracked; ignored files stay),
    /// leaving the work tree at HEAD. The stash's SHA, or `None` when the tree
    /// was clean.
    pub async fn stash_push(&self, message: &str) -> Result<Option<String>, VcsError> {
        if self.dirty(&[]).await?.is_empty() {
            return Ok(None);
        }
        let before = self.stash_top().await?;
        self.run(&[
            "stash",
            "push",
            "--quiet",
            "--include-untracked",
            "--message",
            message,
        ])
        .await?;
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
