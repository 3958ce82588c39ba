//! The run state: the plan loop's truth. Saved atomically (through the
//! [`belay_record::RunHandle`]) after every transition, so that a `kill -9`
//! at any moment resumes where the run stopped.
//!
//! Agents never see this file: it lives in belay's state home, outside every
//! mount. The plan file in the repository is rewritten from it before each
//! agent call.

use serde::{Deserialize, Serialize};

use crate::schema::{Plan, Status};

pub const STATE_VERSION: u32 = 1;

/// Where a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Not built yet.
    Pending,
    /// Rejected by the reviewer: a revision is due.
    Revising,
    /// Built and committed: the review is due.
    Built,
    Approved,
}

impl Stage {
    /// The status the plan file shows.
    pub fn status(self) -> Status {
        match self {
            Stage::Pending => Status::Pending,
            Stage::Revising | Stage::Built => Status::Built,
            Stage::Approved => Status::Approved,
        }
    }
}

/// Who decided a checkpoint's approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub by: String,
    pub review_attempt: Option<u32>,
    pub run_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    pub id: String,
    pub stage: Stage,
    /// Reviews used (the peer's `attempts`).
    pub attempts: u32,
    /// Developer runs that failed (an agent error, a limit, a red gate).
    pub failed_builds: u32,
    pub notes: String,
    /// The commit the checkpoint's work started from (for its diff).
    pub base: Option<String>,
    pub decided: Option<Decision>,
    /// What to tell the next agent on this checkpoint (reverted changes,
    /// failures, the gate's output).
    pub feedback: Vec<String>,
    /// What belay's gate printed on the last build, for the reviewer.
    #[serde(default)]
    pub gate_summary: Option<String>,
    /// Revisions committed (their commits are `<id>: revision N`).
    #[serde(default)]
    pub revisions: u32,
}

/// An agent call in flight (so that a resume knows what was cut short).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    Idle,
    Developing {
        checkpoint: String,
    },
    Reviewing {
        checkpoint: String,
        attempt: u32,
        /// What the ignore rules hid before the reviewer's call (what it adds
        /// there is removed, also after a crash); `None`: unknown.
        #[serde(default)]
        ignored_before: Option<Vec<String>>,
    },
}

/// A commit being made: recorded before, cleared after. A resume that finds
/// it recognises the commit (or makes it) and applies `then`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCommit {
    pub before: String,
    pub message: String,
    pub checkpoint: Option<String>,
    pub then: Option<Stage>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    Halted,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub v: u32,
    pub run_id: String,
    /// The plan file, relative to the repository root.
    pub plan: String,
    pub branch: String,
    pub checkpoints: Vec<CheckpointState>,
    pub phase: Phase,
    pub commit_pending: Option<PendingCommit>,
    pub cost_usd: f64,
    /// Input and output tokens of every agent call, as the agents report them.
    #[serde(default)]
    pub tokens: u64,
    pub agent_calls: u64,
    pub outcome: Option<Outcome>,
    pub reason: Option<String>,
    /// What the run left uncommitted when it stopped (work that failed its
    /// gate): a resume accepts these in the tree, and nothing else.
    #[serde(default)]
    pub left_dirty: Vec<String>,
}

impl RunState {
    /// A new run's state: the statuses the plan file has (a human wrote
    /// them; agents' edits never reach a committed plan file unjudged).
    pub fn new(run_id: &str, plan_rel: &str, plan: &Plan) -> RunState {
        RunState {
            v: STATE_VERSION,
            run_id: run_id.into(),
            plan: plan_rel.into(),
            branch: plan.branch.clone(),
            checkpoints: plan
                .checkpoints
                .iter()
                .map(|c| CheckpointState {
                    id: c.id.clone(),
                    stage: match c.status {
                        Status::Pending => Stage::Pending,
                        Status::Built => Stage::Built,
                        Status::Approved => Stage::Approved,
                    },
                    attempts: c.attempts,
                    failed_builds: 0,
                    notes: c.review_notes.clone(),
                    base: None,
                    decided: (c.status == Status::Approved).then(|| Decision {
                        by: "plan file".into(),
                        review_attempt: None,
                        run_id: run_id.into(),
                    }),
                    feedback: vec![],
                    gate_summary: None,
                    revisions: 0,
                })
                .collect(),
            phase: Phase::Idle,
            commit_pending: None,
            cost_usd: 0.0,
            tokens: 0,
            agent_calls: 0,
            outcome: None,
            reason: None,
            left_dirty: vec![],
        }
    }

    /// Checkpoints the plan gained since the state was made (a human added
    /// them between runs) join as pending; the state keeps the plan's order.
    pub fn follow_plan(&mut self, plan: &Plan) {
        let mut out = Vec::new();
        for c in &plan.checkpoints {
            match self.checkpoints.iter().find(|s| s.id == c.id) {
                Some(s) => out.push(s.clone()),
                None => out.push(CheckpointState {
                    id: c.id.clone(),
                    stage: Stage::Pending,
                    attempts: 0,
                    failed_builds: 0,
                    notes: String::new(),
                    base: None,
                    decided: None,
                    feedback: vec![],
                    gate_summary: None,
                    revisions: 0,
                }),
            }
        }
        self.checkpoints = out;
    }

    pub fn get(&self, id: &str) -> Option<&CheckpointState> {
        self.checkpoints.iter().find(|c| c.id == id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut CheckpointState> {
        self.checkpoints.iter_mut().find(|c| c.id == id)
    }

    /// What the plan file shows of each checkpoint.
    pub fn view(&self) -> Vec<(String, Status, u32, String)> {
        self.checkpoints
            .iter()
            .map(|c| (c.id.clone(), c.stage.status(), c.attempts, c.notes.clone()))
            .collect()
    }
}
