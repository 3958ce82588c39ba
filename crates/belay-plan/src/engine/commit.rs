//! The commit point: belay commits on the host with hooks off, staging what
//! the agents changed (never `.env` files or agent tooling), refusing a
//! change that holds a secret's value. The HEAD before is recorded first, so
//! that a resume after a crash recognises the commit instead of losing or
//! repeating it.

use super::Engine;
use crate::events::PlanEvent;
use crate::state::{PendingCommit, Stage};
use crate::PlanError;

/// Never committed: secrets' usual homes and the agents' own state. (The
/// `**/` forms match at the top too; a pathspec that names a path the
/// repository ignores would make `git add` fail.)
pub const EXCLUDED: &[&str] = &[
    "**/.env",
    "**/.env.*",
    "**/.env/**",
    "**/.env.*/**",
    "**/.codex/**",
    "**/.claude/**",
    "**/.gemini/**",
    "**/.grok/**",
];

/// The agents' tooling directories.
const TOOLING: &[&str] = &[".codex", ".claude", ".gemini", ".grok"];

/// Whether a commit leaves `path` out ([`EXCLUDED`]).
pub fn is_excluded(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    for p in path.split('/') {
        if TOOLING.contains(&p) {
            return true;
        }
        if p == ".env" || p.starts_with(".env.") {
            return true;
        }
    }
    false
}

pub(super) enum Committed {
    Yes,
    Nothing,
    Refused(String),
}

impl Engine<'_> {
    /// Commit with `message` (`paths`: only these; empty: the whole tree);
    /// on success `then` becomes the checkpoint's stage.
    pub(super) async fn commit(
        &mut self,
        message: String,
        checkpoint: Option<&str>,
        then: Option<Stage>,
        allow_empty: bool,
        paths: Vec<String>,
    ) -> Result<Committed, PlanError> {
        let before = self.git.head().await?;
        self.state.commit_pending = Some(PendingCommit {
            before,
            message: message.clone(),
            checkpoint: checkpoint.map(String::from),
            then,
        });
        self.save()?;
        let scanner = self.run.redactor().scanner();
        let outcome = self
            .git
            .commit_checked(belay_vcs::CommitRequest {
                message: message.clone(),
                author: None,
                exclude: vec![],
                exclude_globs: EXCLUDED.iter().map(|s| s.to_string()).collect(),
                allow_empty,
                paths,
                submodules: self.submodules.clone(),
                scan: Box::new(move |_, r| scanner.scan(r)),
            })
            .await;
        self.state.commit_pending = None;
        let subject = message.lines().next().unwrap_or_default().to_string();
        let (result, event) = match outcome {
            Ok(belay_vcs::CommitOutcome::Committed(c)) => {
                self.commits.push(c.sha.clone());
                self.say(&format!(
                    "   commit {} {subject}",
                    &c.sha[..c.sha.len().min(10)]
                ));
                (
                    Committed::Yes,
                    PlanEvent::CommitStatement {
                        commit_hash: Some(c.sha),
                        message: subject,
                        status: "committed",
                        reason: None,
                        recovered: false,
                    },
                )
            }
            Ok(belay_vcs::CommitOutcome::Nothing) => (
                Committed::Nothing,
                PlanEvent::CommitStatement {
                    commit_hash: None,
                    message: subject,
                    status: "no_changes",
                    reason: None,
                    recovered: false,
                },
            ),
            Ok(belay_vcs::CommitOutcome::Refused(r)) => {
                let why = r.to_string();
                self.say(&format!("   commit refused: {why}"));
                (
                    Committed::Refused(why.clone()),
                    PlanEvent::CommitStatement {
                        commit_hash: None,
                        message: subject,
                        status: "refused",
                        reason: Some(why),
                        recovered: false,
                    },
                )
            }
            Err(e) => {
                self.save()?;
                return Err(e.into());
            }
        };
        if !matches!(result, Committed::Refused(_)) {
            if let (Some(id), Some(stage)) = (checkpoint, then) {
                if let Some(cp) = self.state.get_mut(id) {
                    cp.stage = stage;
                }
            }
        }
        self.save()?;
        self.emit(checkpoint, &event)?;
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::is_excluded;

    #[test]
    fn what_a_commit_leaves_out() {
        for p in [
            ".env",
            "a/.env",
            ".env.local",
            "x/y/.env.prod",
            ".codex/auth.json",
            "a/.claude/x",
            ".gemini",
        ] {
            assert!(is_excluded(p), "{p}");
        }
        for p in ["env", "a.env", "src/main.rs", ".envrc", "codex/x"] {
            assert!(!is_excluded(p), "{p}");
        }
    }
}
