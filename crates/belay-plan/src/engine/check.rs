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
        })
        .await?;
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
            if !ok && !tail.trim().is_empty() {
                summary.push_str(&format!("```\n{}\n```\n", tail.trim_end()));
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

fn last_chars(s: &str, n: usize) -> String {
    let count = s.chars().count();
    s.chars().skip(count.saturating_sub(n)).collect()
}
