//! The round supervisor's events on the terminal: each round's end, the
//! stash of a tree a round left dirty (its SHA and why), what the guard put
//! back, the pauses, and the monitor's alerts.

use std::collections::HashMap;

use belay_record::printable_line;
use belay_rounds::events::RoundEvent;

use super::{Line, Render};

/// Keeps each open round's phase (from `round_start`) for its end's line.
#[derive(Debug, Default)]
pub struct RoundLines {
    phases: HashMap<u64, String>,
}

fn note(s: String) -> Vec<Line> {
    vec![Line::Note(s)]
}

fn list(v: &[String]) -> String {
    printable_line(&v.join(", ")).into_owned()
}

/// `timed_out_exit_with_dirty_tree` in words: `the timed out round left
/// the tree dirty`.
fn why_stashed(reason: &str) -> String {
    match reason.strip_suffix("_exit_with_dirty_tree") {
        Some(outcome) => format!(
            "the {} round left the tree dirty",
            outcome.replace('_', " ")
        ),
        None => reason.replace('_', " "),
    }
}

impl Render<RoundEvent> for RoundLines {
    fn lines(&mut self, _step: Option<&str>, e: &RoundEvent) -> Vec<Line> {
        match e {
            RoundEvent::RoundStart {
                round_num, phase, ..
            } => {
                if let Some(p) = phase {
                    self.phases.insert(*round_num, p.clone());
                }
                vec![]
            }
            RoundEvent::RoundEnd {
                round_num,
                exit_code,
                outcome,
                duration_s,
            } => note(format!(
                "round {round_num}{}: {outcome}{} in {duration_s:.1} s",
                self.phases
                    .remove(round_num)
                    .map(|p| format!(" [{}]", printable_line(&p)))
                    .unwrap_or_default(),
                exit_code
                    .map(|c| format!(" (exit {c})"))
                    .unwrap_or_default(),
            )),
            RoundEvent::OrphanStashed {
                round_num,
                sha,
                reason,
                files,
            } => note(format!(
                "round {round_num}: its work ({files} file(s)) is stashed as {sha}: {}; `git stash apply {sha}` brings it back",
                why_stashed(reason)
            )),
            RoundEvent::OrphanStashFailed { round_num, error } => vec![Line::Warn(format!(
                "round {round_num} left the tree dirty and it could not be stashed: {}",
                printable_line(error)
            ))],
            RoundEvent::DirtyAutoCommitted { round_num, commit } => note(format!(
                "round {round_num} left the tree dirty: committed as {commit}"
            )),
            RoundEvent::DirtyCommitFailed { round_num, error } => vec![Line::Warn(format!(
                "round {round_num} left the tree dirty and it could not be committed: {}",
                printable_line(error)
            ))],
            RoundEvent::SchedulePaused { reason, .. } => {
                note(format!("paused: {}", printable_line(reason)))
            }
            RoundEvent::RoundNotStarted { reason } => {
                note(format!("round not started: {}", printable_line(reason)))
            }
            RoundEvent::TransientErrorBackoff { until, class } => {
                note(format!("{class}: pausing until {until}"))
            }
            RoundEvent::StopFileRefused { error, .. } => note(format!(
                "the stop file is there but not read: {}",
                printable_line(error)
            )),
            RoundEvent::LoginCopiedBack { paths, .. } => {
                note(format!("copied the refreshed login back: {}", list(paths)))
            }
            RoundEvent::ControlFileTrusted { paths } => note(format!(
                "prompt files changed since the last round, trusted as they are: {}",
                list(paths)
            )),
            RoundEvent::ControlFileRestored { paths, .. } => note(format!(
                "the agent changed belay's own inputs; put back: {}",
                list(paths)
            )),
            RoundEvent::GitDirRepaired {
                restored,
                links_removed,
                modes_cleared,
                locks_removed,
                specials_removed,
                ..
            } => note(format!(
                "undid what the agent left in the git dir: restored [{}], links [{}], modes [{}], locks [{}], special files [{}]",
                list(restored),
                list(links_removed),
                list(modes_cleared),
                list(locks_removed),
                list(specials_removed)
            )),
            RoundEvent::RepositoryQuarantined { moved, .. } => note(format!(
                "the agent committed submodules whose repositories could run code on your git status; moved aside: {}",
                list(moved)
            )),
            RoundEvent::MonitorAlertEmitted {
                detector,
                severity,
                message,
            } => vec![Line::Warn(format!(
                "monitor: {detector} ({severity}): {}",
                printable_line(message)
            ))],
            RoundEvent::MonitorAutoStopTriggered { detector, .. } => vec![Line::Warn(format!(
                "monitor: {detector} stops the loop"
            ))],
            RoundEvent::Warning { message } => vec![Line::Warn(message.clone())],
            RoundEvent::ServeStarted { .. }
            | RoundEvent::ServeStopped { .. }
            | RoundEvent::RoundInterrupted { .. }
            | RoundEvent::SmokeCheckFailed { .. }
            | RoundEvent::StatusRecovered { .. }
            | RoundEvent::AgentSpawn { .. }
            | RoundEvent::AgentExit { .. }
            | RoundEvent::RoundTimeoutKill { .. }
            | RoundEvent::RoundGraceKill { .. }
            | RoundEvent::LeftoversKilled { .. }
            | RoundEvent::AgentUsageRecorded { .. }
            | RoundEvent::AgentAuthErrorDetected { .. }
            | RoundEvent::TransientErrorDetected { .. }
            | RoundEvent::TransientErrorRecovered { .. }
            | RoundEvent::AgentNetworkBlip { .. }
            | RoundEvent::AnomalyRepetitiveTool { .. }
            | RoundEvent::LimitReached { .. }
            | RoundEvent::GitDirUnchecked { .. }
            | RoundEvent::DirtyDetected { .. }
            | RoundEvent::OrphanIdempotentSkip { .. }
            | RoundEvent::CrashLoop { .. }
            | RoundEvent::StalledNoProgress { .. }
            | RoundEvent::MaxRoundsReached { .. }
            | RoundEvent::StopFileDetected { .. }
            | RoundEvent::AgentDone { .. }
            | RoundEvent::ScheduleResumed {}
            | RoundEvent::SchedulePhaseSkipped { .. }
            | RoundEvent::SignalReceived { .. }
            | RoundEvent::MonitorStarted { .. }
            | RoundEvent::MonitorAlertCleared { .. }
            | RoundEvent::DetectorError { .. } => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stash_names_the_round_its_sha_and_why() {
        let mut r = RoundLines::default();
        let lines = r.lines(
            Some("R3"),
            &RoundEvent::OrphanStashed {
                round_num: 3,
                sha: "0123abcd".into(),
                reason: "timed_out_exit_with_dirty_tree".into(),
                files: 2,
            },
        );
        assert_eq!(
            lines,
            [Line::Note("round 3: its work (2 file(s)) is stashed as 0123abcd: the timed out round left the tree dirty; `git stash apply 0123abcd` brings it back".into())]
        );
    }

    #[test]
    fn a_round_end_names_its_phase() {
        let mut r = RoundLines::default();
        assert!(r
            .lines(
                Some("R1"),
                &RoundEvent::RoundStart {
                    round_num: 1,
                    phase: Some("build".into()),
                    budget_s: 60.0,
                    placement: "host",
                },
            )
            .is_empty());
        let end = RoundEvent::RoundEnd {
            round_num: 1,
            exit_code: Some(0),
            outcome: "clean".into(),
            duration_s: 1.26,
        };
        assert_eq!(
            r.lines(Some("R1"), &end),
            [Line::Note(
                "round 1 [build]: clean (exit 0) in 1.3 s".into()
            )]
        );
    }
}
