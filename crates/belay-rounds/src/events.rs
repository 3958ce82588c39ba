//! The round supervisor's events, in the shared envelope (`kind`, `data`),
//! with the peer's kind names where the peer has the event, so that a
//! filter written for `agent-runner events --kind` keeps working.

use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub cost_usd: f64,
    pub turns: u32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum RoundEvent {
    ServeStarted {
        pid: u32,
        config: String,
        max_rounds: Option<u64>,
    },
    ServeStopped {
        reason: String,
        exit_code: u8,
        rounds: u64,
    },
    /// A round that a killed belay left without an end, recorded by the
    /// next start.
    RoundInterrupted {
        round_num: u64,
        started_at: String,
        agent_killed: bool,
    },
    SmokeCheckFailed {
        reason: String,
    },
    StatusRecovered {
        reason: String,
    },
    RoundStart {
        round_num: u64,
        phase: Option<String>,
        budget_s: f64,
        placement: &'static str,
    },
    AgentSpawn {
        round_num: u64,
        timeout_s: f64,
        agent: String,
    },
    AgentExit {
        round_num: u64,
        exit_code: Option<i32>,
        duration_s: f64,
        timed_out: bool,
        outcome: String,
    },
    RoundTimeoutKill {
        round_num: u64,
        reason: String,
    },
    RoundGraceKill {
        round_num: u64,
        reason: String,
    },
    /// Processes the agent left running, killed after it.
    LeftoversKilled {
        round_num: u64,
        count: usize,
    },
    AgentUsageRecorded {
        round_num: u64,
        #[serde(flatten)]
        usage: Usage,
    },
    AgentAuthErrorDetected {
        round_num: u64,
        line: String,
    },
    TransientErrorDetected {
        round_num: u64,
        class: String,
        reset_at: Option<String>,
        line: String,
    },
    TransientErrorRecovered {
        round_num: u64,
    },
    AgentNetworkBlip {
        round_num: u64,
        line: String,
    },
    AnomalyRepetitiveTool {
        round_num: u64,
        command: String,
        count: u32,
    },
    /// A per-round or per-day limit of belay's stopped the round or the loop.
    LimitReached {
        round_num: u64,
        limit: String,
    },
    /// What the agent left in the git dir, undone.
    GitDirRepaired {
        round_num: u64,
        restored: Vec<String>,
        links_removed: Vec<String>,
        modes_cleared: Vec<String>,
        locks_removed: Vec<String>,
        specials_removed: Vec<String>,
    },
    /// Repositories at submodule paths the agent committed, moved aside
    /// (`sub/.git` to `sub/.git.belay-quarantined`): their config would run
    /// on the user's next `git status` in the outer tree.
    RepositoryQuarantined {
        round_num: u64,
        moved: Vec<String>,
    },
    /// The git dir was beyond checking: no host git ran on it, the loop stops.
    GitDirUnchecked {
        round_num: u64,
        error: String,
    },
    /// The config or a prompt file in the work tree, put back from belay's
    /// trusted copy.
    ControlFileRestored {
        round_num: u64,
        paths: Vec<String>,
    },
    /// Prompt files the user changed while no agent could write them,
    /// trusted as they are now.
    ControlFileTrusted {
        paths: Vec<String>,
    },
    DirtyDetected {
        round_num: u64,
        files: Vec<String>,
        count: usize,
    },
    OrphanStashed {
        round_num: u64,
        #[serde(rename = "ref")]
        sha: String,
        reason: String,
        files: usize,
    },
    /// The agent's refreshed login, copied back to the host's login
    /// directory.
    LoginCopiedBack {
        round_num: u64,
        paths: Vec<String>,
    },
    OrphanIdempotentSkip {
        round_num: u64,
        reason: String,
    },
    OrphanStashFailed {
        round_num: u64,
        error: String,
    },
    DirtyAutoCommitted {
        round_num: u64,
        commit: String,
    },
    DirtyCommitFailed {
        round_num: u64,
        error: String,
    },
    RoundEnd {
        round_num: u64,
        exit_code: Option<i32>,
        outcome: String,
        duration_s: f64,
    },
    CrashLoop {
        rounds: u32,
        delay_s: f64,
        tripped: bool,
    },
    StalledNoProgress {
        rounds: u32,
    },
    MaxRoundsReached {
        max_rounds: u64,
    },
    StopFileDetected {
        path: String,
        reason: String,
    },
    /// The stop file is there but is not a regular file belay reads (a link,
    /// a FIFO, a device): not read, only why. The loop stops all the same.
    StopFileRefused {
        path: String,
        error: String,
    },
    AgentDone {
        reason: String,
    },
    SchedulePaused {
        reason: String,
        until: Option<String>,
    },
    ScheduleResumed {},
    SchedulePhaseSkipped {
        phase: String,
        reason: String,
    },
    TransientErrorBackoff {
        until: String,
        class: String,
    },
    /// A round that could not start (another agent in the repository, no
    /// engine, a limit spent): serve waits and tries again.
    RoundNotStarted {
        reason: String,
    },
    /// Something belay could not do that does not stop the loop (a record
    /// it could not write, a check it could not make).
    Warning {
        message: String,
    },
    SignalReceived {
        signal: String,
        action: String,
    },
    MonitorStarted {
        mode: String,
        interval_s: f64,
    },
    MonitorAlertEmitted {
        detector: String,
        severity: String,
        message: String,
    },
    MonitorAlertCleared {
        detector: String,
    },
    MonitorAutoStopTriggered {
        detector: String,
        draining: bool,
    },
    DetectorError {
        detector: String,
        error: String,
    },
}

impl RoundEvent {
    /// The kind as written (for tests and filters).
    pub fn kind(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str().map(str::to_string)))
            .unwrap_or_default()
    }
}
