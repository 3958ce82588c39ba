//! The typed events of a job's run (in the shared envelope of
//! `events.jsonl`, source `jobs`), and the few of the queue's own that no
//! job's run holds (a front end up, a message to the owners): those are only
//! told to the observer.
//!
//! [`JobRun`] is a job's run with the process's observer: every event it
//! records is told, so the terminal shows what the log holds.

use std::sync::Arc;

use belay_record::{Observer, RecordError, RunHandle};
use serde::Serialize;

/// A job's run, and the observer every event it records is told.
pub struct JobRun {
    run: RunHandle,
    obs: Arc<dyn Observer<JobEvent>>,
}

impl JobRun {
    pub fn new(run: RunHandle, obs: Arc<dyn Observer<JobEvent>>) -> JobRun {
        JobRun { run, obs }
    }

    /// Record an event in the job's run and tell the observer.
    pub fn emit(&self, source: &str, step: Option<&str>, e: &JobEvent) -> Result<u64, RecordError> {
        self.run.emit_to(source, step, e, &*self.obs)
    }

    /// A warning, recorded and told.
    pub fn warn(&self, message: String) {
        let _ = self.emit("jobs", None, &JobEvent::Warning { message });
    }
}

impl std::ops::Deref for JobRun {
    type Target = RunHandle;
    fn deref(&self) -> &RunHandle {
        &self.run
    }
}

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
    /// The image the job's agent and checks run in, and the environment
    /// directories it brings over the worktree (an env build's image).
    Sandbox {
        image: String,
        env_dirs: Vec<String>,
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
        /// Why a job that did not commit failed (its checks, its agent, the
        /// push).
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
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
    /// The job could not run (its repositories, its agent spec, a lock).
    JobFailed {
        job_id: String,
        reason: String,
    },
    /// Set-id bits the agent left in a worktree, cleared.
    SetidCleared {
        repo: String,
        paths: Vec<String>,
    },
    /// Something belay could not do that does not stop the job.
    Warning {
        message: String,
    },
    // The queue's own, told only (no job's run holds them).
    /// The HTTP front end listens.
    HttpListening {
        url: String,
    },
    /// The XMPP front end is online.
    XmppOnline {
        jid: String,
        resumed: bool,
    },
    /// The XMPP front end lost its server and connects again.
    XmppReconnecting {
        reason: String,
    },
    /// A file in the drop directory that is no job, moved to `failed/`.
    DropRefused {
        file: String,
        reason: String,
    },
    /// What the owners were told (by chat where they have an address).
    OwnersTold {
        text: String,
    },
}
