//! belay's own gate: the plan's `build_cmd`, `test_cmd` and `lint_cmd` (a
//! checkpoint's own first), run by belay after the developer and before the
//! reviewer, in a fresh container with no network. A failure goes straight
//! back to the developer and costs no review; the reviewer is given the
//! output.

use belay_agent::checks::last_chars;

use super::Engine;
use crate::events::{GateCommand, PlanEvent};
use crate::prompts::GateReport;
use crate::PlanError;

/// The gate's result.
pub(super) struct GateRun {
    pub passed: bool,
    pub summary: String,
}

impl Engine<'_> {
    pub(super) fn last_gate(&self, id: &str) -> Option<GateReport> {
        self.state
            .get(id)
            .and_then(|c| c.gate_summary.clone())
            .map(|summary| GateReport { summary })
    }

    /// `not_committed`: what the developer made that the gate sees but no
    /// commit holds (named to the reviewer).
    pub(super) async fn check(
        &mut self,
        id: &str,
        not_committed: &[String],
    ) -> Result<Option<GateRun>, PlanError> {
        let cmds = self.plan.commands_for(id);
        let list = cmds.list();
        if list.is_empty() {
            return Ok(None);
        }
        let rt = self.o.rt.clone().ok_or_else(|| {
            PlanError::Usage(
                "the plan has build, test or lint commands, which belay runs in a container: start Docker (./scripts/setup-host.sh)".into(),
            )
        })?;
        // What a commit would hold, before the commands run: they run code
        // the developer wrote, which must not change what they judge.
        let before = self.tree_fingerprint().await?;
        let n = self.state.agent_calls;
        let commands: Vec<(String, String)> = list
            .iter()
            .map(|(name, cmd)| (name.to_string(), cmd.to_string()))
            .collect();
        let ran = belay_agent::checks::run(belay_agent::checks::Checks {
            rt,
            image: &self.o.image,
            run_id: &self.state.run_id,
            kind: "plan-gate",
            tree: self.git.root(),
            git: Some(&self.git),
            records: self.run.path("box"),
            commands: &commands,
            timeout: self.o.gate_timeout,
            log_prefix: self.run.path("gate").join(format!("{n:03}-{id}-")),
            redactor: self.run.redactor(),
            env: &self.env.gate,
        })
        .await?;
        self.gated = true;
        let mut passed = ran.iter().all(|r| r.passed());
        let mut summary = gate_summary(&ran, self.o.gate_timeout);
        // Why, for the terminal and the record: the first command that
        // failed, its output's last lines and its whole log.
        let timeout_s = self.o.gate_timeout.as_secs_f64();
        let mut failure = ran.iter().find(|r| !r.passed()).map(|r| {
            let tail = self
                .run
                .redactor()
                .redact(last_lines(&r.output_tail, 10))
                .into_owned();
            PlanEvent::GateFailed {
                checkpoint: id.into(),
                command: Some(r.name.clone()),
                reason: if r.timed_out {
                    format!(
                        "{}: `{}` timed out after {timeout_s:.0} s",
                        r.name, r.command
                    )
                } else {
                    format!("{}: `{}` failed (exit {})", r.name, r.command, r.exit_code)
                },
                output_tail: self.o.audit.prepare(&tail),
                log: Some(r.log.clone()),
            }
        });
        let ran: Vec<GateCommand> = ran
            .into_iter()
            .map(|r| GateCommand {
                output_tail: self.o.audit.prepare(&r.output_tail),
                name: r.name,
                command: r.command,
                exit_code: r.exit_code,
                timed_out: r.timed_out,
                duration_s: r.duration_s,
            })
            .collect();
        let after = self.tree_fingerprint().await?;
        let changed: Vec<String> = after
            .iter()
            .filter(|e| !before.contains(e))
            .chain(before.iter().filter(|e| !after.contains(e)))
            .map(|(p, _)| p.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !changed.is_empty() {
            passed = false;
            failure.get_or_insert_with(|| PlanEvent::GateFailed {
                checkpoint: id.into(),
                command: None,
                reason: format!(
                    "the commands changed files a commit would hold: {}",
                    changed
                        .iter()
                        .take(10)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                output_tail: String::new(),
                log: None,
            });
            summary.push_str(&format!(
                "- the commands changed files a commit would hold ({}): belay's gate judges the work as it is, so build, test and lint must not rewrite it (a formatter belongs in the developer's run, `--check` in the gate)\n",
                changed.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        self.emit(
            Some(id),
            &PlanEvent::Gate {
                checkpoint: id.into(),
                passed,
                commands: ran,
                not_committed: not_committed.to_vec(),
            },
        )?;
        if let Some(f) = failure.filter(|_| !passed) {
            self.emit(Some(id), &f)?;
        }
        if !not_committed.is_empty() {
            summary.push_str(&format!(
                "Present for these commands but in no commit (the repository ignores them): {}\n",
                not_committed.join(", ")
            ));
        }
        if let Some(cp) = self.state.get_mut(id) {
            cp.gate_summary = Some(summary.clone());
        }
        Ok(Some(GateRun { passed, summary }))
    }
}

/// The gate's summary for the agents: each command and how it ended; a
/// failure's output (for the developer), a pass's tail (for the reviewer).
fn gate_summary(ran: &[belay_agent::checks::CommandRun], timeout: std::time::Duration) -> String {
    let mut summary = String::new();
    for r in ran {
        let ok = r.passed();
        summary.push_str(&format!(
            "- {}: `{}` {}\n",
            r.name,
            r.command,
            if ok {
                "passed".to_string()
            } else if r.timed_out {
                format!("TIMED OUT after {:.0}s", timeout.as_secs_f64())
            } else {
                format!("FAILED (exit {})", r.exit_code)
            }
        ));
        // A failure's output goes back to the developer; a pass's tail
        // goes to the reviewer.
        let shown = if ok {
            last_chars(&r.output_tail, 1500)
        } else {
            r.output_tail.clone()
        };
        if !shown.trim().is_empty() {
            summary.push_str(&format!("```\n{}\n```\n", shown.trim_end()));
        }
    }
    summary
}

/// The last `n` lines of `text` (without the blank ones at its end).
fn last_lines(text: &str, n: usize) -> &str {
    let text = text.trim_end();
    match text.rmatch_indices('\n').nth(n.saturating_sub(1)) {
        Some((i, _)) if n > 0 => &text[i + 1..],
        _ => text,
    }
}

/// How much of a file the gate's fingerprint reads.
const FINGERPRINT_CAP: u64 = 64 << 20;

impl Engine<'_> {
    /// Each changed or untracked (not ignored) path with a hash of what is
    /// there (a link's target, a file's bytes): what a commit would hold,
    /// relative to HEAD.
    async fn tree_fingerprint(&self) -> Result<Vec<(String, String)>, PlanError> {
        use sha2::{Digest, Sha256};
        let root = self.git.root().to_path_buf();
        let dirty = self.git.dirty(&[]).await?;
        let out = tokio::task::spawn_blocking(move || {
            let mut v: Vec<(String, String)> = dirty
                .into_iter()
                .map(|p| {
                    let path = root.join(&p);
                    let h = match fs_err::symlink_metadata(&path) {
                        Ok(m) if m.file_type().is_symlink() => fs_err::read_link(&path)
                            .map(|t| format!("link:{}", t.display()))
                            .unwrap_or_default(),
                        // Read like any file the sandbox wrote: never through
                        // a link, never blocking, at most FINGERPRINT_CAP;
                        // past it, the size and the change time (which
                        // `touch -d` cannot set back) stand for the rest.
                        Ok(m) if m.file_type().is_file() => {
                            match belay_sandbox::hostfs::read(&root, &p, FINGERPRINT_CAP) {
                                Ok(Some(bytes)) => {
                                    let mut hasher = Sha256::new();
                                    hasher.update(&bytes);
                                    if m.len() > FINGERPRINT_CAP {
                                        use std::os::unix::fs::MetadataExt;
                                        hasher.update(
                                            format!("{}:{}.{}", m.len(), m.ctime(), m.ctime_nsec())
                                                .as_bytes(),
                                        );
                                    }
                                    hex::encode(hasher.finalize())
                                }
                                _ => "unreadable".into(),
                            }
                        }
                        Ok(_) => "other".into(),
                        Err(_) => "absent".into(),
                    };
                    (p, h)
                })
                .collect();
            v.sort();
            v
        })
        .await
        .map_err(|e| PlanError::Refused(format!("the tree's fingerprint stopped: {e}")))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::last_lines;

    #[test]
    fn the_tail_is_the_last_lines() {
        let text = (1..=15).map(|i| format!("line {i}\n")).collect::<String>();
        let tail = last_lines(&text, 10);
        assert_eq!(tail.lines().count(), 10);
        assert!(tail.starts_with("line 6\n"), "{tail}");
        assert!(tail.ends_with("line 15"), "{tail}");
        assert_eq!(last_lines("one\ntwo\n\n", 10), "one\ntwo");
        assert_eq!(last_lines("", 10), "");
    }
}
