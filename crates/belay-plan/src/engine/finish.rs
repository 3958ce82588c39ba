//! The end of a run: the outcome recorded, the audit commit (the plan file
//! only), the registry entry; and the checkpoint's diff for the reviewer.

use super::{Engine, Report, Stop};
use crate::events::PlanEvent;
use crate::state::{Outcome, Phase};
use crate::PlanError;

impl Engine<'_> {
    /// The checkpoint's change for the reviewer: the patch when it is small
    /// (at most 4,000 changed lines, cut at 64 KiB), else the summary; never
    /// more than that in memory.
    pub(super) async fn checkpoint_diff(&self, st: &crate::state::CheckpointState) -> String {
        const MAX: usize = 64 * 1024;
        let Some(base) = &st.base else {
            return String::new();
        };
        let numstat = self
            .git
            .run(&["diff", "--numstat", base, "HEAD", "--"])
            .await
            .unwrap_or_default();
        let lines: u64 = numstat
            .lines()
            .map(|l| {
                let mut f = l.split('\t');
                let a = f.next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
                let d = f.next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
                a + d
            })
            .sum();
        if lines > 4000 {
            let stat = self
                .git
                .run(&["diff", "--stat", base, "HEAD", "--"])
                .await
                .unwrap_or_default();
            return format!(
                "{}\n… ({lines} changed lines: read the change in the repository)",
                crate::truncate(&stat, MAX)
            );
        }
        let d = self
            .git
            .run(&["diff", base, "HEAD", "--"])
            .await
            .unwrap_or_default();
        if d.len() > MAX {
            return format!(
                "{}\n… (the diff is cut at 64 KiB: read the rest in the repository)",
                crate::truncate(&d, MAX)
            );
        }
        d
    }

    pub(super) async fn end(mut self, stop: Result<(), Stop>) -> Result<Report, PlanError> {
        let (outcome, reason, message) = match stop {
            Ok(()) => (Outcome::Completed, None, "audit: completed run"),
            Err(Stop::Halted(r)) => (Outcome::Halted, Some(r), "audit: halted"),
            Err(Stop::Failed(r)) => (Outcome::Failed, Some(r), "audit: run failed"),
        };
        let branch = self.state.branch.clone();
        self.state.outcome = Some(outcome);
        self.state.reason = reason.clone();
        self.state.phase = Phase::Idle;
        self.emit(
            None,
            &PlanEvent::RunOutcome {
                outcome: match outcome {
                    Outcome::Completed => "completed",
                    Outcome::Halted => "halted",
                    Outcome::Failed => "failed",
                },
                branch: Some(branch.clone()),
                reason: reason.clone(),
            },
        )?;
        let plan_written = self.write_plan();
        let body = format!(
            "{message}\n\nbelay plan run {}: {}\n{}",
            self.state.run_id,
            reason.as_deref().unwrap_or("every checkpoint approved"),
            self.state
                .checkpoints
                .iter()
                .map(|c| format!(
                    "{}: {} (reviews {}, failed builds {})",
                    c.id,
                    c.stage.status().as_str(),
                    c.attempts,
                    c.failed_builds
                ))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let body = self.run.redactor().redact(&body).into_owned();
        // The audit commit records the plan's state, nothing else: work that
        // did not pass belay's gate stays uncommitted in the tree.
        match plan_written {
            Err(e) => self.warn(format!(
                "no audit commit: the plan file cannot be restored ({e})"
            )),
            Ok(_) => {
                let paths = vec![self.plan_rel.clone()];
                if let Err(e) = self.commit(body, None, None, true, paths).await {
                    self.warn(format!("the audit commit failed: {e}"));
                }
            }
        }
        // What stays uncommitted (work that failed its gate) is the run's:
        // a resume accepts it, and nothing else.
        self.note_left_dirty().await;
        self.save()?;
        if outcome == Outcome::Completed {
            let _ = fs_err::remove_file(&self.index);
            // No agent writes the file after a completed run: the next run is
            // new and takes the plan file as a human left it.
            let key = super::setup::control_key(self.git.root(), &self.plan_rel);
            if let Err(e) = super::setup::control_store().forget(&key) {
                self.warn(format!(
                    "cannot forget the trusted copy of {} ({e}): the next run may ask for --accept-plan",
                    self.plan_rel
                ));
            }
        }
        self.run.finish(belay_record::RunEnd {
            ok: outcome == Outcome::Completed,
            duration_s: self.run.elapsed_s(),
            tokens: self.state.tokens,
            cost_usd: self.state.cost_usd,
            summary: Some(
                self.run
                    .redactor()
                    .redact(reason.as_deref().unwrap_or("completed"))
                    .into_owned(),
            ),
        });
        Ok(Report {
            run_id: self.state.run_id.clone(),
            run_dir: self.run.dir().to_path_buf(),
            branch,
            outcome,
            reason,
            commits: self.commits.clone(),
            cost_usd: self.state.cost_usd,
            agent_calls: self.state.agent_calls,
        })
    }

    /// Stopped on request (SIGINT/SIGTERM) in the middle of a call or a
    /// gate: the call's processes and containers are gone with its future;
    /// the plan file is belay's copy again, the state saved as it was, the
    /// registry says `interrupted`, and the same command resumes the run.
    pub(super) async fn interrupted(mut self, why: String) -> Result<Report, PlanError> {
        let (run, obs) = (&self.run, &*self.o.observer);
        let warn = move |m: &str| super::warn_to(run, obs, m.to_string());
        belay_agent::runner::after_stop(
            self.o.rt.as_deref(),
            &self.state.run_id,
            self.git.root(),
            &warn,
        )
        .await;
        let message = format!(
            "{why}: the run stopped; its work is kept uncommitted and `belay plan run` resumes it"
        );
        self.emit(
            None,
            &PlanEvent::RunOutcome {
                outcome: "interrupted",
                branch: Some(self.state.branch.clone()),
                reason: Some(why.clone()),
            },
        )?;
        if let Err(e) = self.write_plan() {
            self.warn(format!("the plan file cannot be restored ({e})"));
        }
        self.note_left_dirty().await;
        self.save()?;
        self.run.interrupted(belay_record::RunEnd {
            ok: false,
            duration_s: self.run.elapsed_s(),
            tokens: self.state.tokens,
            cost_usd: self.state.cost_usd,
            summary: Some(why),
        });
        Err(PlanError::Interrupted(message))
    }

    /// What stays uncommitted (work that failed its gate, or was stopped)
    /// is the run's: a resume accepts it, and nothing else.
    async fn note_left_dirty(&mut self) {
        self.state.left_dirty = self
            .git
            .dirty(&[])
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p != &self.plan_rel)
            .collect();
    }
}
