//! The commit point: host side, hooks off, only when every gate passed, never with
//! a secret's value, recoverable after a kill.

use super::*;

impl Engine<'_> {
    /// The commit point refused: the event, and a failing verdict that says why.
    pub(super) fn refuse_commit(
        &mut self,
        step: &Step,
        reason: String,
    ) -> Result<StepResult, PipelineError> {
        self.event(
            Some(&step.name),
            PipelineEvent::CommitRefused {
                reason: reason.clone(),
            },
        )?;
        Ok(StepResult {
            verdict: Verdict::Fail,
            detail: reason,
            exit_code: None,
            missing_deps: vec![],
        })
    }

    /// The commit point: host side, hooks off, tooling and paperwork excluded,
    /// only when every gate of this attempt passed and the worktree was clean
    /// at start, and never with a secret's value in it.
    pub(super) async fn commit(&mut self, step: &Step) -> Result<StepResult, PipelineError> {
        if let Some(detail) = self.commit_blocked() {
            return Ok(StepResult {
                verdict: Verdict::Fail,
                detail,
                exit_code: None,
                missing_deps: vec![],
            });
        }
        let root = self.git.root().to_path_buf();
        let mut exclude = tooling_paths(self.p, &root);
        for s in &self.p.steps {
            exclude.extend(s.produces.iter().cloned());
            exclude.extend(s.artifact.iter().cloned());
        }
        exclude.extend(never_committed(self.p));
        let template = step
            .params
            .get("message")
            .and_then(|v| v.as_str())
            .unwrap_or("belay: {pipeline} ({run_id})")
            .to_string();
        let message = self
            .redactor
            .redact(&self.render(&template, step))
            .into_owned();
        if let Some(recovered) = self.recover_pending_commit(step, &message).await? {
            return Ok(recovered);
        }
        if let Some(reason) = self.commit_refusal(&root).await? {
            return self.refuse_commit(step, reason);
        }
        // git refuses a pathspec beyond a symbolic link: an output whose
        // parent a step made a link cannot be in the tree anyway.
        exclude.retain(|e| belay_sandbox::hostfs::parents_are_dirs(&root, e));
        let scanner = self.redactor.scanner();
        // A kill between the commit and the next save must not lose it: the
        // HEAD before is recorded first, and a resume recognises the commit.
        self.state.commit_pending = Some(self.git.head().await?);
        self.save()?;
        let submodules = self.state.submodules_at_start.clone();
        let outcome = self
            .git
            .commit_checked(belay_vcs::CommitRequest {
                message: message.clone(),
                author: None,
                exclude,
                exclude_globs: self.p.sync_excludes.clone(),
                allow_empty: false,
                paths: vec![],
                submodules,
                scan: Box::new(move |_, r| scanner.scan(r)),
            })
            .await?;
        self.state.commit_pending = None;
        let committed = match outcome {
            belay_vcs::CommitOutcome::Committed(c) => c,
            belay_vcs::CommitOutcome::Nothing => {
                self.save()?;
                self.event(
                    Some(&step.name),
                    PipelineEvent::Commit {
                        sha: None,
                        message: None,
                        files: None,
                        files_total: None,
                        recovered: false,
                        skipped: Some("nothing to commit"),
                    },
                )?;
                return Ok(StepResult {
                    verdict: Verdict::Pass,
                    detail: "nothing to commit".into(),
                    exit_code: None,
                    missing_deps: vec![],
                });
            }
            belay_vcs::CommitOutcome::Refused(r) => {
                self.save()?;
                return self.refuse_commit(step, r.to_string());
            }
        };
        let sha = committed.sha;
        self.git.record_commit(&self.run, &sha).await;
        self.state.commit = Some(sha.clone());
        self.save()?;
        self.event(
            Some(&step.name),
            PipelineEvent::Commit {
                sha: Some(sha.clone()),
                message: Some(message.clone()),
                files: Some(cap_list(&committed.files).to_vec()),
                files_total: Some(committed.files_total),
                recovered: false,
                skipped: None,
            },
        )?;
        Ok(StepResult {
            verdict: Verdict::Pass,
            detail: String::new(),
            exit_code: None,
            missing_deps: vec![],
        })
    }

    /// Why this attempt may not commit (a worktree dirty at start, gates not passed), or `None`.
    fn commit_blocked(&self) -> Option<String> {
        if !self.state.clean_at_start {
            return Some("the worktree had uncommitted changes when the run started: belay does not mix them into its commit. Commit or stash them and start a new run".into());
        }
        let failed: Vec<&String> = self
            .state
            .verdicts
            .iter()
            .filter(|(_, v)| **v != Verdict::Pass)
            .map(|(k, _)| k)
            .collect();
        if !failed.is_empty() {
            return Some(format!(
                "gates that did not pass in this attempt: {}",
                failed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        None
    }

    /// The step's result if a killed run's pending commit is recognised; clears the pending mark.
    async fn recover_pending_commit(
        &mut self,
        step: &Step,
        message: &str,
    ) -> Result<Option<StepResult>, PipelineError> {
        if let Some(before) = self.state.commit_pending.clone() {
            if let Some(head) = self.git.recognise_commit(&before, message).await? {
                self.state.commit = Some(head.clone());
                self.state.commit_pending = None;
                self.save()?;
                self.event(
                    Some(&step.name),
                    PipelineEvent::Commit {
                        sha: Some(head.clone()),
                        message: None,
                        files: None,
                        files_total: None,
                        recovered: true,
                        skipped: None,
                    },
                )?;
                return Ok(Some(StepResult {
                    verdict: Verdict::Pass,
                    detail: String::new(),
                    exit_code: None,
                    missing_deps: vec![],
                }));
            }
            self.state.commit_pending = None;
        }
        Ok(None)
    }

    /// Why the tree may not be committed (changed tooling, a nested repository), or `None`.
    async fn commit_refusal(&mut self, root: &Path) -> Result<Option<String>, PipelineError> {
        // A step may not change the pipeline's tooling (the file, the agents,
        // the shared files, the policy files) and get the change committed.
        let tooling = tooling_paths(self.p, root);
        let refs: Vec<&str> = tooling.iter().map(String::as_str).collect();
        let changed = self.git.dirty(&refs).await?;
        if !changed.is_empty() {
            let reason = format!("a step changed the pipeline's tooling ({}); nothing was committed. Restore it from HEAD and start a new run", changed.join(", "));
            return Ok(Some(reason));
        }
        // A nested `.git` that git does not ignore (inside a tracked directory,
        // where `ls-files --others` does not look): a person running git there
        // would run its config. Submodules of the start are theirs to have.
        let nested: Vec<String> = self
            .nested_git
            .iter()
            .map(|p| {
                p.trim_end_matches("/.git")
                    .trim_end_matches(".git")
                    .trim_end_matches('/')
                    .to_string()
            })
            .filter(|dir| !self.state.submodules_at_start.contains(dir))
            .collect();
        let nested = self.git.not_ignored(&nested).await?;
        if !nested.is_empty() {
            return Ok(Some(
                belay_vcs::Refusal::EmbeddedRepository(nested).to_string(),
            ));
        }
        Ok(None)
    }
}
