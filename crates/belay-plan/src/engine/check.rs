//! belay's own gate: the plan's `build_cmd`, `test_cmd` and `lint_cmd` (a
//! checkpoint's own first), run by belay after the developer and before the
//! reviewer, in a fresh container with no network. A failure goes straight
//! back to the developer and costs no review; the reviewer is given the
//! output.

use belay_agent::{AgentBox, AgentSpec, BoxSpec};
use belay_sandbox::{ExecSpec, NoopObserver};

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
        // No agent runs here: the built-in spec mounts no CLI.
        let none = AgentSpec {
            kind: belay_agent::AgentKind::Builtin,
            model: None,
        };
        let gate_box = AgentBox::open(BoxSpec {
            rt: rt.clone(),
            image: self.o.image.clone(),
            run_id: self.state.run_id.clone(),
            kind: "plan-gate".into(),
            repo: self.git.root().to_path_buf(),
            git: Some(&self.git),
            records: self.run.path("box"),
            agent: &none,
            model_url: None,
            network: false,
            keep: false,
            extras: Default::default(),
        })
        .await?;
        // What a commit would hold, before the commands run: they run code
        // the developer wrote, which must not change what they judge.
        let before = self.tree_fingerprint().await?;
        let n = self.state.agent_calls;
        let mut ran = Vec::new();
        let mut passed = true;
        let mut summary = String::new();
        for (name, cmd) in list {
            let log = self
                .run
                .path("gate")
                .join(format!("{n:03}-{id}-{name}.log"));
            if let Some(d) = log.parent() {
                fs_err::create_dir_all(d).map_err(|e| PlanError::io("create", d, e))?;
            }
            let out = rt
                .exec(
                    gate_box.id(),
                    &ExecSpec {
                        argv: vec!["sh".into(), "-c".into(), cmd.to_string()],
                        working_dir: Some(belay_agent::sandbox::WORKDIR.into()),
                        env: vec![("HOME".into(), "/tmp".into())],
                        timeout: Some(self.o.gate_timeout),
                        log_path: log,
                        log_limit: None,
                    },
                    self.run.redactor(),
                    &NoopObserver,
                )
                .await;
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    let _ = gate_box.close().await;
                    return Err(e.into());
                }
            };
            let ok = out.success();
            let mut tail = out.stdout_tail.clone();
            if !out.stderr_tail.is_empty() {
                tail.push_str(&out.stderr_tail);
            }
            let tail = last_chars(&tail, 4000);
            summary.push_str(&format!(
                "- {name}: `{cmd}` {}\n",
                if ok {
                    "passed".to_string()
                } else if out.timed_out {
                    format!("TIMED OUT after {:.0}s", self.o.gate_timeout.as_secs_f64())
                } else {
                    format!("FAILED (exit {})", out.exit_code)
                }
            ));
            // A failure's output goes back to the developer; a pass's tail
            // goes to the reviewer.
            let shown = if ok {
                last_chars(&tail, 1500)
            } else {
                tail.clone()
            };
            if !shown.trim().is_empty() {
                summary.push_str(&format!("```\n{}\n```\n", shown.trim_end()));
            }
            ran.push(GateCommand {
                name: name.into(),
                command: cmd.into(),
                exit_code: out.exit_code,
                timed_out: out.timed_out,
                duration_s: out.duration.as_secs_f64(),
                output_tail: self.o.audit.prepare(&tail),
            });
            if !ok {
                passed = false;
                break;
            }
        }
        let _ = gate_box.close().await?;
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
        (self.o.progress)(&format!(
            ">> {id} gate {}",
            if passed {
                "passed"
            } else {
                "FAILED: back to the developer"
            }
        ));
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
                        Ok(m) if m.file_type().is_file() => {
                            let mut hasher = Sha256::new();
                            match fs_err::File::open(&path) {
                                Ok(mut f) => {
                                    let _ = std::io::copy(&mut f, &mut hasher);
                                    hex::encode(hasher.finalize())
                                }
                                Err(_) => "unreadable".into(),
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

fn last_chars(s: &str, n: usize) -> String {
    let count = s.chars().count();
    s.chars().skip(count.saturating_sub(n)).collect()
}
