//! The commit point: belay commits on the host with hooks off, staging what
//! the agents changed (never `.env` files or agent tooling), refusing a
//! change that holds a secret's value. The HEAD before is recorded first, so
//! that a resume after a crash recognises the commit instead of losing or
//! repeating it.

use super::Engine;
use crate::events::PlanEvent;
use crate::state::{PendingCommit, Stage};
use crate::PlanError;

pub use belay_vcs::excludes::is_excluded;

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
                exclude_globs: belay_vcs::excludes::agent_exclude_globs(),
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
                self.git.record_commit(&self.run, &c.sha).await;
                self.commits.push(c.sha.clone());
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
