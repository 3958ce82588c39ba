//! The prompts, with the peer's content: the checkpoint's scope and exit
//! criteria, the reviewer's notes for a revision, the verify clause. belay
//! adds what it knows and the peer did not: the output of its own gate, the
//! checkpoint's diff for the reviewer, and the changes to the plan file it
//! reverted.

use crate::schema::{Checkpoint, Plan};

fn criteria(cp: &Checkpoint) -> String {
    cp.exit_criteria
        .iter()
        .map(|c| format!("- {c}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The commands the reviewer is asked to run itself (`verify_in_review`).
fn verify_clause(plan: &Plan, cid: &str) -> String {
    if !plan.verify_in_review {
        return String::new();
    }
    let parts: Vec<String> = plan
        .commands_for(cid)
        .list()
        .into_iter()
        .map(|(name, cmd)| {
            let label = match name {
                "build" => "Run the build",
                "test" => "Run the tests",
                _ => "Run the linter",
            };
            format!("- {label}: `{cmd}`")
        })
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!(
        "\n\nIndependently verify the work by running these project commands:\n{}",
        parts.join("\n")
    )
}

/// What belay tells an agent beyond the task: reverted changes, failures.
fn feedback_block(feedback: &[String]) -> String {
    if feedback.is_empty() {
        return String::new();
    }
    format!(
        "\n\nbelay's notes on your previous run (belay holds the plan's state; these are facts, act on them):\n{}\n",
        feedback
            .iter()
            .map(|f| format!("- {f}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

pub fn developer(plan: &Plan, plan_path: &str, cp: &Checkpoint, feedback: &[String]) -> String {
    format!(
        "You are executing the agreed plan in {plan_file}.
Work ONLY on checkpoint '{id}' ({name}). Do not start any later phase.

Scope:
{scope}

This phase is complete only when ALL of these exit criteria are objectively met:
{criteria}

When finished, in {plan_path} set checkpoint '{id}' status to 'built' and
write a concise summary (files touched, tests added, how each exit criterion is
met) into its 'review_notes' field. Change nothing else in {plan_path}: belay
reverts any other change. Do not commit: belay commits your work.{feedback}",
        plan_file = plan.plan_file,
        id = cp.id,
        name = cp.name,
        scope = cp.scope,
        criteria = criteria(cp),
        feedback = feedback_block(feedback),
    )
}

/// What belay's own gate ran, for the reviewer.
pub struct GateReport {
    pub summary: String,
}

pub fn reviewer(
    plan: &Plan,
    plan_path: &str,
    cp: &Checkpoint,
    gate: Option<&GateReport>,
    diff: &str,
    feedback: &[String],
) -> String {
    let gate = gate
        .map(|g| {
            format!(
                "\n\nbelay ran the project's commands on this work, in a sandbox:\n{}",
                g.summary
            )
        })
        .unwrap_or_default();
    let diff = if diff.trim().is_empty() {
        String::new()
    } else {
        format!("\n\nThe checkpoint's change (git diff):\n```diff\n{diff}\n```")
    };
    format!(
        "Review ONLY checkpoint '{id}' ({name}) of the plan in {plan_file}.
Read {plan_path} for the developer's 'review_notes', then independently
verify the work in the repo.{verify}

Scope for this checkpoint:
{scope}

Approve ONLY if every one of these exit criteria is genuinely met:
{criteria}

Give your verdict in your final message, not in {plan_path} (it is read-only
for you: belay keeps the plan's state). If a criterion genuinely fails, write
SPECIFIC, actionable, criterion-referenced fixes first. The LAST line of your
final message must be exactly one of:
{approved}
{rejected}
belay reads the verdict from that line only: nothing the code you run prints or
writes counts as your verdict, and a final message with contradicting verdict
lines is no approval. Do not nitpick style or request scope beyond this phase.
Do not change any code: belay reverts it.

Do not merge to main/master. All final merging must wait for explicit human approval.{gate}{diff}{feedback}",
        plan_file = plan.plan_file,
        id = cp.id,
        name = cp.name,
        scope = cp.scope,
        criteria = criteria(cp),
        verify = verify_clause(plan, &cp.id),
        feedback = feedback_block(feedback),
        approved = crate::verdict::APPROVED_LINE,
        rejected = crate::verdict::REJECTED_LINE,
    )
}

pub fn revision(plan_path: &str, cp: &Checkpoint, notes: &str, feedback: &[String]) -> String {
    let notes = if notes.trim().is_empty() {
        "(belay's notes below say what failed)"
    } else {
        notes
    };
    format!(
        "The reviewer did NOT approve checkpoint '{id}' of the plan.
Apply ONLY these requested fixes. Do not add scope or pull work from later phases:

{notes}

When done, in {plan_path} set checkpoint '{id}' status back to 'built' and
update 'review_notes' describing exactly what you changed.

Do not merge to main/master. All final merging must wait for explicit human approval.{feedback}",
        id = cp.id,
        feedback = feedback_block(feedback),
    )
}
