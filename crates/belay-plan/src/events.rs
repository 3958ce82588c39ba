//! The plan loop's events, in the shared envelope (`kind`, `data`). The
//! peer's five (AGENT_TRACE, REVIEW_COMMENT, APPROVAL_COMMENT,
//! COMMIT_STATEMENT, RUN_OUTCOME) keep their fields, as snake_case kinds;
//! belay adds what its gates do.

use serde::Serialize;

use crate::gate::Violation;

#[derive(Debug, Clone, Serialize)]
pub struct GateCommand {
    pub name: String,
    pub command: String,
    pub exit_code: i64,
    pub timed_out: bool,
    pub duration_s: f64,
    pub output_tail: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum PlanEvent {
    RunStarted {
        run_id: String,
        /// The repository root: `repo` + `plan` is the plan file.
        repo: std::path::PathBuf,
        plan: String,
        branch: String,
        resumed: bool,
        audit_level: crate::audit::AuditLevel,
        max_review_attempts: u32,
    },
    /// A developer run of a checkpoint begins (`run_kind`: build or
    /// revision).
    CheckpointStarted {
        checkpoint: String,
        name: String,
        run_kind: &'static str,
    },
    /// A review of a checkpoint begins.
    ReviewStarted {
        checkpoint: String,
        review_attempt: u32,
        max_review_attempts: u32,
    },
    /// An agent call: `action` start, prompt or finish (the peer's AGENT_TRACE).
    AgentTrace {
        action: &'static str,
        checkpoint: String,
        agent: String,
        role: &'static str,
        run_kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_s: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        prompt: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        outcome: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        duration_s: Option<f64>,
    },
    /// Changes to the plan file that were not the agent's to make: reverted.
    ChangeReverted {
        checkpoint: String,
        role: &'static str,
        violations: Vec<Violation>,
    },
    /// The plan file changed during a review (by the reviewer, or by code it
    /// ran): refused and restored from belay's state, never a transition.
    PlanTampered {
        checkpoint: String,
        role: &'static str,
        violations: Vec<Violation>,
    },
    /// The plan file changed between runs and the user accepted it
    /// (`--accept-plan`), or a new run found it changed: taken as it is.
    PlanChanged { plan: String },
    /// Code the reviewer changed: reverted (the reviewer only decides).
    ReviewerEditsReverted {
        checkpoint: String,
        /// The first 50.
        paths: Vec<String>,
        /// All of them.
        count: usize,
    },
    /// belay's own run of the project's commands.
    Gate {
        checkpoint: String,
        passed: bool,
        commands: Vec<GateCommand>,
        /// Paths the developer made that the gate saw but no commit holds
        /// (ignored by the repository's rules).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        not_committed: Vec<String>,
    },
    /// Why belay's gate failed, after its `gate` event: the first command
    /// that failed, the tail of its output and its whole log (or, when
    /// every command passed, that they changed the tree).
    GateFailed {
        checkpoint: String,
        /// The command's name (`build`, `test`, `lint`), when one failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        command: Option<String>,
        /// In one line: `test: `cargo test` failed (exit 101)`.
        reason: String,
        /// The last lines (at most 10) of the command's output, redacted
        /// (and kept as the audit level keeps agent text).
        output_tail: String,
        /// The command's whole output, redacted.
        #[serde(skip_serializing_if = "Option::is_none")]
        log: Option<std::path::PathBuf>,
    },
    /// Files the developer made that a commit never holds (`.env` files,
    /// agent tooling): removed before the gate, so that the gate sees what
    /// is committed.
    ExcludedRemoved {
        checkpoint: String,
        paths: Vec<String>,
    },
    /// Processes a host agent left outside its group: killed.
    LeftoversKilled { checkpoint: String, count: usize },
    /// The developer's call did not end well: not built, retried.
    BuildFailed {
        checkpoint: String,
        reason: String,
        failed_builds: u32,
    },
    ReviewComment {
        checkpoint: String,
        comment: String,
        review_attempt: u32,
        status: String,
        /// The verdict of the reviewer's answer (`approved`, `rejected`);
        /// absent when the review gave none (it failed, or its answer did
        /// not end with a verdict line).
        #[serde(skip_serializing_if = "Option::is_none")]
        verdict: Option<&'static str>,
    },
    ApprovalComment {
        approval_status: &'static str,
        checkpoint: String,
        comment: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        review_attempt: Option<u32>,
        source: &'static str,
    },
    CommitStatement {
        #[serde(skip_serializing_if = "Option::is_none")]
        commit_hash: Option<String>,
        message: String,
        status: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        recovered: bool,
    },
    /// Agent processes of a killed run, killed at the resume.
    StaleAgentKilled { checkpoint: Option<String> },
    RunOutcome {
        outcome: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The image agents and the gate run in, and the environment directories
    /// it brings over the work tree (an env build's image).
    Sandbox {
        image: String,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        env_dirs: Vec<String>,
    },
    /// Something belay could not do that does not stop the run (the audit
    /// commit, the cleanup after a stop, a container the agent runner could
    /// not remove).
    Warning { message: String },
}
