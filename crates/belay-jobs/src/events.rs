//! The typed events of a job's run (in the shared envelope of
//! `events.jsonl`, source `jobs`).

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum JobEvent {
    JobStarted {
        job_id: String,
        sender: String,
        requested_by: String,
        role: &'static str,
        agent: String,
        iteration_limit: u32,
        repos: Vec<String>,
        /// From the job's arrival in the queue to this start, in seconds.
        queued_s: Option<f64>,
    },
    ForeignChangesStashed {
        repo: String,
        stash: String,
    },
    ForeignChangesRestored {
        repo: String,
        stash: String,
    },
    /// The foreign changes could not be applied back: they stay in the
    /// stash list by SHA.
    ForeignChangesKept {
        repo: String,
        stash: String,
        reason: String,
    },
    WorktreeAdded {
        repo: String,
        path: String,
        branch: String,
        base: String,
    },
    AgentStarted {
        attempt: &'static str,
    },
    AgentFinished {
        attempt: &'static str,
        stop: String,
        turns: u32,
        interim: bool,
        cost_usd: f64,
        duration_s: f64,
    },
    FixResultInvalid {
        attempt: &'static str,
        error: String,
    },
    ChecksRan {
        repo: String,
        passed: bool,
        commands: Vec<belay_agent::checks::CommandRun>,
    },
    Committed {
        repo: String,
        branch: String,
        hash: String,
        files: usize,
    },
    CommitRefused {
        repo: String,
        reason: String,
    },
    Pushed {
        repo: String,
        remote: String,
        branch: String,
        hash: String,
    },
    PublishFailed {
        repo: String,
        reason: String,
    },
    HeldForApproval {
        repo: String,
        stash: String,
    },
    HookRan {
        hash: String,
        exit_code: Option<i32>,
        ok: bool,
    },
    JobFinished {
        job_id: String,
        status: String,
        commits: usize,
        /// Seconds outside the agent: worktrees, stashes, checks, commit,
        /// push, record.
        overhead_s: f64,
        duration_s: f64,
    },
    JobInterrupted {
        job_id: String,
        reason: String,
    },
}
