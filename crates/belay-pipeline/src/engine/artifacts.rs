//! A run's artifacts (`artifact:` verdict files, `produces:` outputs): kept in
//! the run's own directory and mounted into every step at [`ARTIFACTS`], so a
//! read-only step can write its findings and the worktree stays clean for the
//! commit and the next run. Everything in it was written by a step, so it is
//! read and changed through hostfs (no link, no FIFO, bounded).

use super::*;

/// The most of an artifact belay reads or moves.
const ARTIFACT_MAX: u64 = 16 * 1024 * 1024;

/// The most `artifact_scrubbed` events one sweep of the artifacts directory
/// writes (one more gives the count of the rest).
const ARTIFACT_EVENTS: usize = 200;

impl Engine<'_> {
    /// The run's artifacts directory on the host (made when the run opens).
    pub(super) fn artifacts_dir(&self) -> PathBuf {
        self.run.path(ARTIFACTS_DIR)
    }

    /// Delete a step's declared outputs before an attempt (stale artifacts
    /// never decide): in the artifacts directory, and a copy a step left in
    /// the workspace.
    pub(super) fn hygiene(&mut self, step: &Step) -> Result<(), PipelineError> {
        let roots = [self.artifacts_dir(), self.git.root().to_path_buf()];
        for rel in step.produces.iter().chain(step.artifact.iter()) {
            for root in &roots {
                workspace_path(root, rel)?;
                let removed = match belay_sandbox::hostfs::remove(root, rel) {
                    Ok(r) => r,
                    // A link on the way (a step's doing): there is no stale file
                    // belay could read through it, so nothing to delete.
                    Err(e @ belay_sandbox::hostfs::HostFsError::Refused { .. }) => {
                        self.event(
                            Some(&step.name),
                            PipelineEvent::ArtifactUnreachable {
                                path: rel.to_string(),
                                why: e.to_string(),
                            },
                        )?;
                        false
                    }
                    Err(e) => {
                        return Err(PipelineError::Infra(format!(
                            "cannot delete the stale {rel} in {}: {e}; check that belay may write there",
                            root.display()
                        )))
                    }
                };
                if removed {
                    self.event(
                        Some(&step.name),
                        PipelineEvent::ArtifactDeleted {
                            path: rel.to_string(),
                        },
                    )?;
                }
            }
        }
        Ok(())
    }

    /// After a step: a declared output it wrote into the workspace (a command
    /// such as `pytest --junitxml=report.xml`) is moved to the artifacts
    /// directory, unless the step wrote it there too. The worktree keeps no
    /// paperwork.
    pub(super) fn collect_outputs(&mut self, step: &Step) -> Result<(), PipelineError> {
        let art = self.artifacts_dir();
        let root = self.git.root().to_path_buf();
        for rel in step.produces.iter().chain(step.artifact.iter()) {
            if matches!(belay_sandbox::hostfs::read(&art, rel, 1), Ok(Some(_))) {
                continue;
            }
            let bytes = match belay_sandbox::hostfs::read(&root, rel, ARTIFACT_MAX + 1) {
                Ok(Some(b)) if b.len() as u64 <= ARTIFACT_MAX => b,
                Ok(Some(_)) => {
                    self.event(
                        Some(&step.name),
                        PipelineEvent::ArtifactUnreachable {
                            path: rel.to_string(),
                            why: "larger than 16 MiB: left in the workspace, scrubbed there, never committed".into(),
                        },
                    )?;
                    continue;
                }
                Ok(None) => continue,
                Err(e) => {
                    self.event(
                        Some(&step.name),
                        PipelineEvent::ArtifactUnreachable {
                            path: rel.to_string(),
                            why: e.to_string(),
                        },
                    )?;
                    continue;
                }
            };
            // Scrubbed on the way: the secret never reaches the state dir.
            let (bytes, scrubbed) = match std::str::from_utf8(&bytes) {
                Ok(text) => match self.redactor.redact(text) {
                    std::borrow::Cow::Owned(t) => (t.into_bytes(), true),
                    std::borrow::Cow::Borrowed(_) => (bytes, false),
                },
                Err(_) => (bytes, false),
            };
            self.write_artifact(rel, &bytes)?;
            let _ = belay_sandbox::hostfs::remove(&root, rel);
            self.event(
                Some(&step.name),
                PipelineEvent::ArtifactCollected {
                    path: rel.to_string(),
                    bytes: bytes.len(),
                },
            )?;
            if scrubbed {
                self.event(Some(&step.name), PipelineEvent::scrubbed(rel))?;
            }
        }
        Ok(())
    }

    /// Write an artifact belay made (an agent's final answer), through no link.
    fn write_artifact(&self, rel: &str, bytes: &[u8]) -> Result<(), PipelineError> {
        let art = self.artifacts_dir();
        workspace_path(&art, rel)?;
        belay_sandbox::hostfs::write(&art, rel, bytes).map_err(|e| {
            PipelineError::Infra(format!(
                "cannot write the artifact {rel} in {}: {e}",
                art.display()
            ))
        })
    }

    /// An agent step with `produces:` that wrote none of it: its final answer
    /// becomes the first file (the dev role's summary, as agentic-dev-loop).
    pub(super) fn capture_summary(
        &mut self,
        step: &Step,
        final_text: &str,
    ) -> Result<(), PipelineError> {
        let Some(first) = step.produces.first() else {
            return Ok(());
        };
        if final_text.trim().is_empty() || self.read_artifact(first).is_some() {
            return Ok(());
        }
        let text = self.redactor.redact(final_text).into_owned();
        self.write_artifact(first, text.as_bytes())?;
        self.event(
            Some(&step.name),
            PipelineEvent::SummaryCaptured {
                path: first.to_string(),
                bytes: text.len(),
            },
        )
    }

    /// An artifact's text, redacted, when it is there and readable.
    pub(super) fn read_artifact(&self, rel: &str) -> Option<String> {
        let art = self.artifacts_dir();
        workspace_path(&art, rel).ok()?;
        match belay_sandbox::hostfs::read(&art, rel, ARTIFACT_MAX) {
            Ok(Some(bytes)) => Some(
                self.redactor
                    .redact(&String::from_utf8_lossy(&bytes))
                    .into_owned(),
            ),
            _ => None,
        }
    }

    /// Scrub secret values out of a step's declared outputs (in the artifacts
    /// directory and a copy left in the workspace): they are records of the
    /// run, and may be read by the next steps and by people. Everything else
    /// in the artifacts directory was scrubbed at the step's end
    /// ([`Self::scrub_artifacts_dir`]).
    pub(super) fn scrub_outputs(&mut self, step: &Step) -> Result<(), PipelineError> {
        if self.redactor.is_empty() {
            return Ok(());
        }
        let roots = [self.artifacts_dir(), self.git.root().to_path_buf()];
        for (rel, root) in step
            .produces
            .iter()
            .chain(step.artifact.iter())
            .flat_map(|r| roots.iter().map(move |root| (r, root)))
        {
            // Streamed: any size, nothing cut, never through a link. (A
            // copy too large to collect stays in the workspace: scrubbed there.)
            match belay_sandbox::hostfs::scrub(root, rel, &self.redactor) {
                Ok(true) => self.event(Some(&step.name), PipelineEvent::scrubbed(rel))?,
                Ok(false) => {}
                Err(e @ belay_sandbox::hostfs::HostFsError::Refused { .. }) => self.event(
                    Some(&step.name),
                    PipelineEvent::ArtifactUnreachable {
                        path: rel.to_string(),
                        why: e.to_string(),
                    },
                )?,
                Err(e) => {
                    return Err(PipelineError::Infra(format!(
                        "cannot scrub {rel} in {}: {e}; check that belay may write there",
                        root.display()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Scrub the whole artifacts directory at a step's end (also one that
    /// failed to run; no step process is alive): undeclared files, file and
    /// directory names, link targets. A name holding a secret is renamed to
    /// its redacted form first, then every regular file is scrubbed streamed,
    /// never through a link ([`belay_sandbox::hostfs::scrub_tree`]). At most
    /// [`ARTIFACT_EVENTS`] `artifact_scrubbed` events, then one with the
    /// count of the rest.
    pub(super) fn scrub_artifacts_dir(&mut self, step: &str) -> Result<(), PipelineError> {
        let art = self.artifacts_dir();
        let done = belay_sandbox::hostfs::scrub_tree(&art, &self.redactor).map_err(|e| {
            PipelineError::Infra(format!(
                "cannot scrub the run's artifacts in {} after step `{step}`: {e}; a secret may be left there. Check that belay may write there (remove a path it cannot open), then resume the run",
                art.display(),
            ))
        })?;
        let undeclared = |p: &String, renamed: bool, link: bool| PipelineEvent::ArtifactScrubbed {
            path: Some(p.clone()),
            undeclared: true,
            renamed,
            link,
            more: None,
        };
        let changes: Vec<PipelineEvent> = done
            .renamed
            .iter()
            .map(|p| undeclared(p, true, false))
            .chain(done.scrubbed.iter().map(|p| undeclared(p, false, false)))
            .chain(done.relinked.iter().map(|p| undeclared(p, false, true)))
            .take(ARTIFACT_EVENTS)
            .collect();
        let total = done.renamed.len() + done.scrubbed.len() + done.relinked.len();
        for e in changes {
            self.event(Some(step), e)?;
        }
        if total > ARTIFACT_EVENTS {
            self.event(
                Some(step),
                PipelineEvent::ArtifactScrubbed {
                    path: None,
                    undeclared: true,
                    renamed: false,
                    link: false,
                    more: Some(total - ARTIFACT_EVENTS),
                },
            )?;
        }
        Ok(())
    }
}
