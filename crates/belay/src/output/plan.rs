//! The plan loop's events on the terminal: a line per checkpoint, review,
//! gate, verdict and commit, and the outcome; a failed gate with its reason,
//! the last lines of the failing command's output and the path of its log.

use belay_plan::events::PlanEvent;
use belay_record::printable_line;

use super::{quoted_tail, Line, Render};

/// How many lines of a failed gate command's output are shown.
const GATE_TAIL_LINES: usize = 10;

/// Keeps the plan file's name (from `run_started`) for later lines.
#[derive(Debug, Default)]
pub struct PlanLines {
    plan: String,
}

fn note(s: String) -> Vec<Line> {
    vec![Line::Note(s)]
}

impl Render<PlanEvent> for PlanLines {
    fn lines(&mut self, _step: Option<&str>, e: &PlanEvent) -> Vec<Line> {
        match e {
            PlanEvent::RunStarted {
                run_id,
                plan,
                branch,
                resumed,
                ..
            } => {
                self.plan = plan.clone();
                note(format!(
                    "{}run {run_id} on {}",
                    if *resumed { "resuming " } else { "" },
                    printable_line(branch)
                ))
            }
            PlanEvent::CheckpointStarted {
                checkpoint,
                name,
                run_kind,
            } => note(format!(
                "== CHECKPOINT {checkpoint}: {} ({run_kind}) ==",
                printable_line(name)
            )),
            PlanEvent::ReviewStarted {
                checkpoint,
                review_attempt,
                max_review_attempts,
            } => note(format!(
                "--- {checkpoint} review attempt {review_attempt}/{max_review_attempts} ---"
            )),
            PlanEvent::ChangeReverted { violations, .. } => note(format!(
                ">> reverted {} change(s) the developer made to {} that were not its to make",
                violations.len(),
                self.plan
            )),
            PlanEvent::PlanTampered {
                checkpoint,
                violations,
                ..
            } => note(format!(
                ">> {} changed during the review of {checkpoint} ({} change(s)): refused and restored from belay's state; the verdict is the reviewer's answer",
                self.plan,
                violations.len()
            )),
            PlanEvent::ReviewerEditsReverted { count, .. } => note(format!(
                ">> reverted the reviewer's edits to {count} path(s): the reviewer only decides"
            )),
            PlanEvent::Gate {
                checkpoint, passed, ..
            } if *passed => note(format!(">> {checkpoint} gate passed")),
            PlanEvent::GateFailed {
                checkpoint,
                reason,
                output_tail,
                log,
                ..
            } => {
                let mut out = note(format!(
                    ">> {checkpoint} gate FAILED: back to the developer: {}",
                    printable_line(reason)
                ));
                out.extend(quoted_tail(output_tail, GATE_TAIL_LINES));
                if let Some(log) = log {
                    out.push(Line::Note(format!("   full log: {}", log.display())));
                }
                out
            }
            PlanEvent::BuildFailed {
                checkpoint, reason, ..
            } => note(format!(
                ">> {checkpoint} not built: {}",
                printable_line(reason)
            )),
            PlanEvent::ReviewComment {
                checkpoint,
                comment,
                review_attempt,
                verdict,
                ..
            } => match verdict {
                Some("approved") => vec![],
                Some(_) => note(format!(
                    ">> {checkpoint} sent back (review {review_attempt})"
                )),
                None => note(format!(
                    ">> {checkpoint} no decision: {}",
                    printable_line(comment)
                )),
            },
            PlanEvent::ApprovalComment {
                checkpoint, source, ..
            } => note(match *source {
                "reviewer" => format!(">> {checkpoint} APPROVED"),
                "existing_checkpoint" => format!(">> {checkpoint} already approved: skip"),
                other => format!(">> {checkpoint} approved ({other})"),
            }),
            PlanEvent::CommitStatement {
                commit_hash,
                message,
                status,
                reason,
                ..
            } => match (*status, commit_hash) {
                ("committed", Some(sha)) => note(format!(
                    "   commit {} {}",
                    &sha[..sha.len().min(10)],
                    printable_line(message)
                )),
                ("refused", _) => note(format!(
                    "   commit refused: {}",
                    printable_line(reason.as_deref().unwrap_or_default())
                )),
                _ => vec![],
            },
            PlanEvent::RunOutcome {
                outcome,
                branch,
                reason,
            } => outcome_lines(outcome, branch.as_deref(), reason.as_deref()),
            PlanEvent::Warning { message } => vec![Line::Warn(message.clone())],
            PlanEvent::Sandbox { image, env_dirs } if !env_dirs.is_empty() => note(format!(
                "### sandbox: {} (its {} over the work tree)",
                printable_line(image),
                env_dirs.join(", ")
            )),
            PlanEvent::Sandbox { .. } => vec![],
            PlanEvent::Gate { .. }
            | PlanEvent::AgentTrace { .. }
            | PlanEvent::PlanChanged { .. }
            | PlanEvent::ExcludedRemoved { .. }
            | PlanEvent::LeftoversKilled { .. }
            | PlanEvent::StaleAgentKilled { .. } => vec![],
        }
    }
}

/// The run's last lines: how it ended.
fn outcome_lines(outcome: &str, branch: Option<&str>, reason: Option<&str>) -> Vec<Line> {
    let reason = printable_line(reason.unwrap_or_default()).into_owned();
    match outcome {
        "completed" => vec![
            Line::Note(format!(
                "### All checkpoints approved on branch {}.",
                printable_line(branch.unwrap_or_default())
            )),
            Line::Note("### No merge was performed. Review the branch and merge it only after explicit human approval.".into()),
        ],
        "halted" => note(format!("### halted: {reason}")),
        "interrupted" => note(format!(
            "### interrupted: {reason}: the run stopped; its work is kept uncommitted and `belay plan run` resumes it"
        )),
        _ => note(format!("### run failed: {reason}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(lines: Vec<Line>) -> Vec<String> {
        lines
            .into_iter()
            .map(|l| match l {
                Line::Note(t) => t,
                Line::Warn(t) => format!("warning: {t}"),
            })
            .collect()
    }

    #[test]
    fn a_failed_gate_says_why_and_where_its_log_is() {
        let mut r = PlanLines::default();
        let output: String = (1..=14).map(|i| format!("out {i}\n")).collect();
        let lines = text(r.lines(
            Some("c1"),
            &PlanEvent::GateFailed {
                checkpoint: "c1".into(),
                command: Some("test".into()),
                reason: "test: `make test` failed (exit 2)".into(),
                output_tail: format!("{output}\x1b]52;c;eA==\x07done\n"),
                log: Some("/runs/r1/gate/001-c1-test.log".into()),
            },
        ));
        assert_eq!(
            lines[0],
            ">> c1 gate FAILED: back to the developer: test: `make test` failed (exit 2)"
        );
        // The last lines only, under the line they explain.
        assert_eq!(lines.len(), 1 + 10 + 1, "{lines:?}");
        assert_eq!(lines[1], "   | out 6");
        assert_eq!(lines[10], "   | \x1b]52;c;eA==\x07done");
        assert_eq!(lines[11], "   full log: /runs/r1/gate/001-c1-test.log");
    }

    #[test]
    fn the_verdicts_and_the_outcome_keep_their_lines() {
        let mut r = PlanLines::default();
        let review = |verdict| PlanEvent::ReviewComment {
            checkpoint: "c2".into(),
            comment: "the reviewer gave no verdict: no VERDICT line".into(),
            review_attempt: 2,
            status: "built".into(),
            verdict,
        };
        assert_eq!(
            text(r.lines(Some("c2"), &review(Some("rejected")))),
            [">> c2 sent back (review 2)"]
        );
        assert_eq!(
            text(r.lines(Some("c2"), &review(None))),
            [">> c2 no decision: the reviewer gave no verdict: no VERDICT line"]
        );
        assert!(r.lines(Some("c2"), &review(Some("approved"))).is_empty());
        let end = PlanEvent::RunOutcome {
            outcome: "halted",
            branch: Some("feature/x".into()),
            reason: Some("c2 not approved\nafter 3".into()),
        };
        assert_eq!(
            text(r.lines(None, &end)),
            ["### halted: c2 not approved\\nafter 3"]
        );
        assert_eq!(
            text(r.lines(
                None,
                &PlanEvent::Warning {
                    message: "the audit commit failed".into()
                }
            )),
            ["warning: the audit commit failed"]
        );
    }
}
