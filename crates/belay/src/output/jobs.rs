//! The job queue's events on the terminal: a job's start and end (with why
//! a failed job failed), the front ends coming up, and what the owners are
//! told.

use belay_jobs::events::JobEvent;
use belay_record::printable_line;

use super::{quoted_tail, Line, Render};

/// How many lines of a failed job's reason (a check's output) are shown.
const REASON_LINES: usize = 10;

#[derive(Debug, Default)]
pub struct JobLines;

fn note(s: String) -> Vec<Line> {
    vec![Line::Note(s)]
}

/// `first: rest` lines of a multi-line text: its first line after `head`,
/// the last lines of the rest quoted under it.
fn with_reason(head: String, reason: &str) -> Vec<Line> {
    let reason = reason.trim();
    let (first, rest) = reason.split_once('\n').unwrap_or((reason, ""));
    let mut out = note(format!("{head}: {}", printable_line(first)));
    out.extend(quoted_tail(rest, REASON_LINES));
    out
}

impl Render<JobEvent> for JobLines {
    fn lines(&mut self, _step: Option<&str>, e: &JobEvent) -> Vec<Line> {
        match e {
            JobEvent::JobStarted {
                job_id,
                agent,
                role,
                ..
            } => note(format!(
                "job {job_id} started ({}, {role})",
                printable_line(agent)
            )),
            JobEvent::JobFinished {
                job_id,
                status,
                reason,
                ..
            } => match reason {
                Some(r) => with_reason(format!("job {job_id} {status}"), r),
                None => note(format!("job {job_id} {status}")),
            },
            JobEvent::JobFailed { job_id, reason } => {
                with_reason(format!("job {job_id} failed before its agent ran"), reason)
            }
            JobEvent::SetidCleared { repo, paths } => note(format!(
                "cleared set-id bits the agent left on {} in {}",
                printable_line(&paths.join(", ")),
                printable_line(repo)
            )),
            JobEvent::Warning { message } => vec![Line::Warn(message.clone())],
            JobEvent::HttpListening { url } => note(format!("http: listening on {url}")),
            JobEvent::XmppOnline { jid, resumed } => note(format!(
                "xmpp: online as {}{}",
                printable_line(jid),
                if *resumed { " (resumed)" } else { "" }
            )),
            JobEvent::XmppReconnecting { reason } => note(format!(
                "xmpp: {}; connecting again",
                printable_line(reason)
            )),
            JobEvent::DropRefused { file, reason } => note(format!(
                "drop: {} is no job: {}",
                printable_line(file),
                printable_line(reason)
            )),
            // A message to the owners, as chat shows it: its lines.
            JobEvent::OwnersTold { text } => text
                .trim_end()
                .lines()
                .map(|l| Line::Note(l.to_string()))
                .collect(),
            JobEvent::ForeignChangesStashed { .. }
            | JobEvent::ForeignChangesRestored { .. }
            | JobEvent::ForeignChangesKept { .. }
            | JobEvent::WorktreeAdded { .. }
            | JobEvent::Sandbox { .. }
            | JobEvent::AgentStarted { .. }
            | JobEvent::AgentFinished { .. }
            | JobEvent::FixResultInvalid { .. }
            | JobEvent::ChecksRan { .. }
            | JobEvent::Committed { .. }
            | JobEvent::CommitRefused { .. }
            | JobEvent::Pushed { .. }
            | JobEvent::PublishFailed { .. }
            | JobEvent::HeldForApproval { .. }
            | JobEvent::HookRan { .. }
            | JobEvent::JobInterrupted { .. } => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_job_says_why() {
        let mut r = JobLines;
        let reason = "site: the check `grep -q ok index.html` failed (exit 1); nothing was committed.\nline one\nline two\n";
        let lines = r.lines(
            None,
            &JobEvent::JobFinished {
                job_id: "j1".into(),
                status: "check_failed".into(),
                reason: Some(reason.into()),
                commits: 0,
                overhead_s: 0.0,
                duration_s: 1.0,
            },
        );
        assert_eq!(
            lines,
            [
                Line::Note("job j1 check_failed: site: the check `grep -q ok index.html` failed (exit 1); nothing was committed.".into()),
                Line::Note("   | line one".into()),
                Line::Note("   | line two".into()),
            ]
        );
        let ok = r.lines(
            None,
            &JobEvent::JobFinished {
                job_id: "j2".into(),
                status: "committed".into(),
                reason: None,
                commits: 1,
                overhead_s: 0.0,
                duration_s: 1.0,
            },
        );
        assert_eq!(ok, [Line::Note("job j2 committed".into())]);
    }
}
