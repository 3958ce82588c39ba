//! Run state: one small file, rewritten atomically after every transition
//! (its size does not grow with the run), and the append-only event log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    pub started_at: String,
    pub updated_at: String,
}

/// The files of one run: `<state_dir>/runs/<run_id>/`.
#[derive(Debug, Clone)]
pub struct RunFiles {
    pub root: PathBuf,
}

impl RunFiles {
    pub fn new(state_dir: &Path, run_id: &str) -> Self {
        RunFiles {
            root: state_dir.join("runs").join(run_id),
        }
    }
    pub fn state(&self) -> PathBuf {
        self.root.join("state.json")
    }
    pub fn events(&self) -> PathBuf {
        self.root.join("events.jsonl")
    }
    pub fn summary(&self) -> PathBuf {
        self.root.join("summary.json")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn llm_usage(&self) -> PathBuf {
        self.root.join("llm-usage.json")
    }
}
