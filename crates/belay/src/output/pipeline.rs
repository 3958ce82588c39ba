//! The pipeline's console: one line per step start, verdict, route and
//! retry (with the first line of the feedback), and each step's duration and
//! cost, made from the run's events as they are written.

use std::collections::HashMap;

use belay_pipeline::events::PipelineEvent;
use belay_pipeline::schema::StepKind;
use serde::Serialize;

use super::{Line, Render};

/// Turns events into console lines; keeps what a later line needs (an agent
/// step's cost, told before its end).
#[derive(Default)]
pub struct Console {
    cost: HashMap<String, f64>,
}

fn first_line(s: &str, max: usize) -> String {
    // The feedback starts with belay's own "Step `x` did not pass" line;
    // the gate's first words are more telling.
    let line = s
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("Step `"))
        .unwrap_or("");
    if line.chars().count() > max {
        let cut: String = line.chars().take(max).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

/// A serde enum's name as it is written (`pass`, `failed`).
fn word(v: &impl Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Console {
    /// The line for an event, if it gets one: one line, printable (a gate's
    /// feedback, a step's name and a reason are the pipeline's or its
    /// steps' text, shown with their control characters escaped).
    pub fn line(&mut self, step: Option<&str>, e: &PipelineEvent) -> Option<String> {
        self.text(step, e)
            .map(|l| belay_record::printable_line(&l).into_owned())
    }

    fn text(&mut self, step: Option<&str>, e: &PipelineEvent) -> Option<String> {
        let step = step.unwrap_or("-");
        match e {
            PipelineEvent::StepStart {
                attempt, step_kind, ..
            } => {
                let what = match step_kind {
                    StepKind::Agent { .. } => "agent",
                    StepKind::Command { .. } => "command",
                    StepKind::Action { .. } => "action",
                };
                Some(format!("{step}: start ({what}, attempt {attempt})"))
            }
            PipelineEvent::AgentReport { cost_usd, .. } => {
                *self.cost.entry(step.to_string()).or_default() += cost_usd;
                None
            }
            PipelineEvent::StepEnd {
                verdict,
                exit_code,
                duration_s,
                ..
            } => {
                let cost = self
                    .cost
                    .remove(step)
                    .filter(|c| *c > 0.0)
                    .map(|c| format!(", ${c:.4}"))
                    .unwrap_or_default();
                let exit = exit_code.map(|c| format!(", exit {c}")).unwrap_or_default();
                Some(format!(
                    "{step}: {} in {duration_s:.1} s{exit}{cost}",
                    word(verdict)
                ))
            }
            PipelineEvent::Route {
                verdict,
                to,
                feedback,
            } => {
                let fb = feedback
                    .as_deref()
                    .map(|f| first_line(f, 160))
                    .filter(|f| !f.is_empty())
                    .map(|f| format!(": {f}"))
                    .unwrap_or_default();
                Some(format!("{step}: {} -> {to}{fb}", word(verdict)))
            }
            PipelineEvent::Attempt {
                attempt,
                max_attempts,
            } => Some(format!("retry: attempt {attempt} of {max_attempts}")),
            PipelineEvent::Commit {
                sha,
                files_total,
                skipped,
                ..
            } => match sha {
                Some(sha) => Some(format!(
                    "{step}: committed {} ({} file(s))",
                    &sha[..sha.len().min(12)],
                    files_total.unwrap_or(0)
                )),
                None => Some(format!("{step}: {}", skipped.unwrap_or_default())),
            },
            PipelineEvent::CommitRefused { reason } => {
                Some(format!("{step}: commit refused: {reason}"))
            }
            PipelineEvent::StepInterrupted { reason, .. } => {
                Some(format!("{step}: interrupted ({reason})"))
            }
            PipelineEvent::RunResumed(r) => Some(format!(
                "resumed at {} (attempt {} of {})",
                r.current.as_deref().unwrap_or_default(),
                r.attempt,
                r.max_attempts
            )),
            _ => None,
        }
    }
}

impl Render<PipelineEvent> for Console {
    fn lines(&mut self, step: Option<&str>, e: &PipelineEvent) -> Vec<Line> {
        if let PipelineEvent::UntrackedAtStart {
            files, files_total, ..
        } = e
        {
            // File names are anyone's: one line, printable.
            let names = files.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
            return vec![Line::Warn(format!(
                "the worktree has {files_total} uncommitted or untracked file(s) ({}{}): the commit point will refuse to mix them into its commit. Commit or stash them, .gitignore build output, or list it in sync_excludes",
                belay_record::printable_line(&names),
                if *files_total > 8 { ", …" } else { "" }
            ))];
        }
        self.line(step, e).map(Line::Note).into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use belay_pipeline::verdict::Verdict;

    fn route(step_feedback: &str) -> PipelineEvent {
        PipelineEvent::Route {
            verdict: Verdict::Fail,
            to: "dev (retry)".into(),
            feedback: Some(step_feedback.into()),
        }
    }

    #[test]
    fn a_retry_route_names_the_target_and_the_feedback() {
        let mut c = Console::default();
        let fb = "Step `test` did not pass (verdict: Fail, exit code 1).\nFAILED tests/test_x.py::test_y - assert 1 == 2\n...";
        let l = c.line(Some("test"), &route(fb));
        assert_eq!(
            l.as_deref(),
            Some("test: fail -> dev (retry): FAILED tests/test_x.py::test_y - assert 1 == 2")
        );
    }

    #[test]
    fn feedback_cannot_drive_the_terminal() {
        let mut c = Console::default();
        let fb = "Step `test` did not pass.\nok\r\x1b[2K\x1b]52;c;cHduZWQ=\x07all good";
        let l = c.line(
            Some("te\x1b[1Ast"),
            &PipelineEvent::Route {
                verdict: Verdict::Fail,
                to: "dev".into(),
                feedback: Some(fb.into()),
            },
        );
        assert_eq!(
            l.as_deref(),
            Some("te\\x1b[1Ast: fail -> dev: ok\\r\\x1b[2K\\x1b]52;c;cHduZWQ=\\x07all good")
        );
        let l = c.line(
            Some("dev"),
            &PipelineEvent::CommitRefused {
                reason: "two\nlines".into(),
            },
        );
        assert_eq!(l.as_deref(), Some("dev: commit refused: two\\nlines"));
    }

    #[test]
    fn a_step_end_has_its_duration_and_its_agent_cost() {
        let mut c = Console::default();
        let report = PipelineEvent::AgentReport {
            runner: "codex".into(),
            stop: belay_agent::StopReason::Completed,
            turns: 1,
            usage: Default::default(),
            cost_usd: 0.0123,
            files_changed: vec![],
            exit_code: Some(0),
            final_text: String::new(),
            stderr_tail: String::new(),
        };
        assert_eq!(c.line(Some("dev"), &report), None);
        let end = |verdict, exit_code, duration_s| PipelineEvent::StepEnd {
            n: 1,
            verdict,
            exit_code,
            duration_s,
        };
        let l = c.line(Some("dev"), &end(Verdict::Pass, None, 12.34));
        assert_eq!(l.as_deref(), Some("dev: pass in 12.3 s, $0.0123"));
        let l = c.line(Some("test"), &end(Verdict::Fail, Some(1), 1.0));
        assert_eq!(l.as_deref(), Some("test: fail in 1.0 s, exit 1"));
    }
}
