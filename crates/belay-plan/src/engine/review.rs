//! The review: the reviewer's call, its verdict, and the approval commit or
//! the send-back.
//!
//! The verdict is the last line of the reviewer's own answer
//! ([`crate::verdict`]), never the plan file or anything else in the work
//! tree: the reviewer may run the code under review, and that code can write
//! whatever the reviewer can. In a container the plan file is mounted
//! read-only for the review; a change found in it afterwards is tampering,
//! recorded and reverted ([`super::call`]).

use super::commit::Committed;
use super::{Engine, Stop};
use crate::events::PlanEvent;
use crate::gate::Role;
use crate::state::{Decision, Phase, Stage};
use crate::verdict::{self, Verdict};

impl Engine<'_> {
    /// One review: the call, its verdict, the commit.
    pub(super) async fn review(&mut self, id: &str) -> Result<(), Stop> {
        let st =
            self.state.get(id).cloned().ok_or_else(|| {
                Stop::Failed(format!("checkpoint `{id}` is not in the run state"))
            })?;
        // A review cut short by a crash keeps its number.
        let attempt = match &self.state.phase {
            Phase::Reviewing {
                checkpoint,
                attempt,
                ..
            } if checkpoint == id => *attempt,
            _ => st.attempts + 1,
        };
        self.cp_mut(id).map_err(Self::failed)?.attempts = attempt;
        let ignored_before = self.ignored_now().await;
        self.state.phase = Phase::Reviewing {
            checkpoint: id.into(),
            attempt,
            ignored_before: ignored_before.clone(),
        };
        self.save().map_err(Self::failed)?;
        self.emit(
            Some(id),
            &PlanEvent::ReviewStarted {
                checkpoint: id.into(),
                review_attempt: attempt,
                max_review_attempts: self.o.max_review_attempts,
            },
        )
        .map_err(Self::failed)?;
        let cp_plan = self
            .plan
            .get(id)
            .cloned()
            .ok_or_else(|| Stop::Failed(format!("checkpoint `{id}` is not in the plan")))?;
        let gate = self.last_gate(id);
        let diff = self.checkpoint_diff(&st).await;
        let prompt = crate::prompts::reviewer(
            &self.plan,
            &self.plan_rel,
            &cp_plan,
            gate.as_ref(),
            &diff,
            &[],
        );
        let out = self.call(Role::Reviewer, id, "review", &prompt).await;
        // Whatever happened, the reviewer's edits do not stay.
        self.revert_reviewer_edits(id, ignored_before.as_deref())
            .await
            .map_err(Self::failed)?;
        let out = out.map_err(Self::failed)?;
        // The verdict: the reviewer's own answer, nothing else.
        let answer = match (out.failure, out.answer) {
            (Some(fail), _) => {
                return self.no_verdict(id, attempt, &format!("the reviewer failed: {fail}"))
            }
            (None, answer) => match verdict::read(answer.as_deref().unwrap_or_default()) {
                Ok(a) => a,
                Err(e) => {
                    return self.no_verdict(
                        id,
                        attempt,
                        &format!("the reviewer gave no verdict: {e}"),
                    )
                }
            },
        };
        // The notes go into prompts, the plan file and its commits: no
        // secret's value with them.
        let notes = self.run.redactor().redact(&answer.notes).into_owned();
        let approved = answer.verdict == Verdict::Approved;
        self.emit(
            Some(id),
            &PlanEvent::ReviewComment {
                checkpoint: id.into(),
                comment: self.o.audit.prepare(&notes),
                review_attempt: attempt,
                status: if approved { "approved" } else { "built" }.into(),
                verdict: Some(answer.verdict.as_str()),
            },
        )
        .map_err(Self::failed)?;
        {
            let run_id = self.state.run_id.clone();
            let cp = self.cp_mut(id).map_err(Self::failed)?;
            if approved {
                // An approval without notes keeps the developer's.
                if !notes.is_empty() {
                    cp.notes = notes.clone();
                }
                cp.decided = Some(Decision {
                    by: "reviewer".into(),
                    review_attempt: Some(attempt),
                    run_id,
                });
            } else {
                // Notes the reviewer did not write are not its requested fixes.
                cp.notes = notes.clone();
            }
        }
        self.state.phase = Phase::Idle;
        if approved {
            return self.approve(id, attempt, &notes).await;
        }
        self.send_back(id)
    }

    /// A review without a verdict (the reviewer failed, or its answer did not
    /// end with one): the attempt is used, the review is due again.
    fn no_verdict(&mut self, id: &str, attempt: u32, why: &str) -> Result<(), Stop> {
        self.state.phase = Phase::Idle;
        self.emit(
            Some(id),
            &PlanEvent::ReviewComment {
                checkpoint: id.into(),
                comment: self.o.audit.prepare(why),
                review_attempt: attempt,
                status: "built".into(),
                verdict: None,
            },
        )
        .map_err(Self::failed)?;
        self.write_plan().map_err(Self::failed)?;
        self.save().map_err(Self::failed)
    }

    /// The reviewer approved: recorded, then committed (`<id>: approved`).
    async fn approve(&mut self, id: &str, attempt: u32, notes: &str) -> Result<(), Stop> {
        self.emit(
            Some(id),
            &PlanEvent::ApprovalComment {
                approval_status: "approved",
                checkpoint: id.into(),
                comment: self.o.audit.prepare(notes),
                review_attempt: Some(attempt),
                source: "reviewer",
            },
        )
        .map_err(Self::failed)?;
        self.cp_mut(id).map_err(Self::failed)?.stage = Stage::Approved;
        self.write_plan().map_err(Self::failed)?;
        let made = self
            .commit(
                format!("{id}: approved"),
                Some(id),
                Some(Stage::Approved),
                true,
                vec![self.plan_rel.clone()],
            )
            .await
            .map_err(Self::failed)?;
        if let Committed::Refused(why) = made {
            // Not committed, not approved: the review is due again.
            self.cp_mut(id).map_err(Self::failed)?.stage = Stage::Built;
            let _ = self.write_plan();
            let _ = self.save();
            return Err(Stop::Failed(format!(
                "the approval of {id} could not be committed: {why}"
            )));
        }
        Ok(())
    }

    /// The reviewer rejected: the revision is due, with its notes.
    fn send_back(&mut self, id: &str) -> Result<(), Stop> {
        {
            let cp = self.cp_mut(id).map_err(Self::failed)?;
            cp.stage = Stage::Revising;
            cp.feedback.clear();
        }
        self.write_plan().map_err(Self::failed)?;
        self.save().map_err(Self::failed)
    }
}
