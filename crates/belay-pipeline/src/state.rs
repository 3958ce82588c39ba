//! Run state: one small file, rewritten atomically after every transition
//! (its size does not grow with the run), and the append-only event log.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::verdict::Verdict;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub version: u32,
    pub run_id: String,
    pub pipeline: PathBuf,
    /// sha256 of the pipeline file: a resume refuses a changed pipeline.
    pub pipeline_hash: String,
    pub status: Status,
    /// The step to run next (or running now).
    pub current: Option<String>,
    /// The attempt (1-based); a route with `retry: true` starts the next one.
    pub attempt: u32,
    pub max_attempts: u32,
    /// Step executions so far (numbers logs and events).
    pub step_runs: u64,
    /// The last failing gate's output, for the next agent attempt.
    pub feedback: Option<String>,
    /// The latest verdict of each gate in this attempt.
    pub verdicts: BTreeMap<String, Verdict>,
    pub clean_at_start: bool,
    pub head_at_start: String,
    pub commit: Option<String>,
    /// HEAD just before the commit point committed (cleared once recorded).
    #[serde(default)]
    pub commit_pending: Option<String>,
    pub failure: Option<String>,
    /// The submodules of `.gitmodules` at the start: the only gitlinks the
    /// commit point accepts.
    #[serde(default)]
    pub submodules_at_start: Vec<String>,
    /// The git dir's control files at the start (`Git::control_files`).
    #[serde(default)]
    pub git_control_at_start: BTreeMap<String, String>,
    /// With `allow_git_mutations`: the git dir's record at the start (hooks,
    /// guarded files, links, worktrees, replace refs), put back after every
    /// step (`belay_vcs::GitDirGuard`, as the round supervisor does).
    #[serde(default)]
    pub git_guard: Option<belay_vcs::GitDirGuard>,
    pub started_at: String,
    pub updated_at: String,
    /// A run that ended because its attempts ran out: the retry route it
    /// could not take, so `--resume ID --max-attempts N` can take it.
    #[serde(default)]
    pub exhausted: Option<Exhausted>,
}

/// Where an exhausted run stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exhausted {
    /// The gate that failed last.
    pub step: String,
    /// The step its retry route goes to.
    pub next: String,
}

/// The pipeline's own files in a run directory (the state and the event log
/// are `belay_record::STATE_FILE` and `EVENTS_FILE`).
pub const SUMMARY_FILE: &str = "summary.json";
pub const LOGS_DIR: &str = "logs";
pub const LLM_USAGE_FILE: &str = "llm-usage.json";
