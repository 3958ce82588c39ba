//! `manifest.json` and `executions.jsonl` records (FORMATS.md §1), plus a few
//! fields of belay's own (status, timings, engine, base image).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::Block;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProgressControl {
    pub forward_granularity: String,
    pub recovery_granularity: String,
    pub local_repair: bool,
    pub patch_back: bool,
    pub checkpoint_rollback: bool,
    pub final_clean_replay: bool,
}

impl ProgressControl {
    /// What this build of belay does: block-level forward execution, stop at
    /// the first failing block.
    pub fn forward_only() -> Self {
        ProgressControl {
            forward_granularity: "block".into(),
            recovery_granularity: "none".into(),
            local_repair: false,
            patch_back: false,
            checkpoint_rollback: false,
            final_clean_replay: false,
        }
    }
}

/// Model usage of a run. Zero for the rules planner.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LlmUsage {
    pub planner: String,
    pub model: Option<String>,
    pub requests: u64,
    pub retries: u64,
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub latency_s: f64,
    pub cost_usd: f64,
    /// Each time the model failed and the rules answered instead, and why.
    #[serde(default)]
    pub fallbacks: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CacheStats {
    pub enabled: bool,
    pub hits: u32,
    pub misses: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Checkpoint {
    pub id: String,
    pub image_ref: String,
    pub block_id: String,
    pub parent_image_ref: Option<String>,
    pub kind: String,
    #[serde(default)]
    pub image_id: String,
    #[serde(default)]
    pub created_at: String,
    /// Set when this checkpoint is a cache hit: the checkpoint it reuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_from: Option<String>,
}

/// One record per Docker build, block, validation, finalization or oracle command.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Execution {
    pub block_id: String,
    pub phase: String,
    pub attempt: u32,
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub stdout_tail: String,
    pub stderr_tail: String,
    pub checkpoint_before: Option<String>,
    pub checkpoint_after: Option<String>,
    pub repair_command: Option<String>,
    pub duration_s: f64,
    pub command: String,
    pub log_path: Option<PathBuf>,
    #[serde(default)]
    pub started_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OracleCommandResult {
    pub oracle_id: String,
    pub command: String,
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub ok: bool,
    pub duration_s: f64,
    pub log_path: PathBuf,
    /// The command as written in the oracle file, when `--oracle-collect-only` rewrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewritten_from: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OracleReport {
    pub oracle_file: PathBuf,
    pub ok: bool,
    pub commands: Vec<OracleCommandResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub ok: bool,
    /// running | succeeded | failed
    pub status: String,
    pub run_id: String,
    pub repo_path: PathBuf,
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    pub scripts_dir: PathBuf,
    pub manifest_path: PathBuf,
    pub llm_usage_path: PathBuf,
    /// For BuildKit, with the package cache mounts.
    pub dockerfile_path: Option<PathBuf>,
    /// The same for the legacy builder (no `RUN --mount`).
    #[serde(default)]
    pub dockerfile_legacy_path: Option<PathBuf>,
    pub base_image: Option<String>,
    /// The Debian suite of the default base, and why it was chosen (absent
    /// with --base-image / --base-dockerfile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_suite: Option<crate::base_suite::SuiteChoice>,
    pub final_image: Option<String>,
    pub error: Option<String>,
    /// What kind of failure repair could not fix, when it is a known kind
    /// (`needs network at collection: host …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_class: Option<String>,
    pub llm_usage: LlmUsage,
    pub ablation_mode: String,
    pub progress_control: ProgressControl,
    pub final_clean_replay_enabled: bool,
    pub final_clean_replay_ok: Option<bool>,
    pub final_clean_replay_image: Option<String>,
    pub final_clean_replay_failure_stage: Option<String>,
    /// Why the clean replay did not run, or what it proved.
    #[serde(default)]
    pub final_clean_replay_note: Option<String>,
    /// The leading blocks that ran before the repository copy, and the image
    /// the workspace checkpoint sits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolchain: Option<ToolchainLayers>,
    pub oracle: Option<OracleReport>,
    #[serde(default)]
    pub cache: CacheStats,
    /// With `--registry`: what was pushed and pulled, and how long the build
    /// waited for pushes at its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<crate::registry_store::RegistryReport>,
    /// Repairs applied in this run (local fixes and blamed rollbacks).
    #[serde(default)]
    pub repairs: u32,
    pub blocks: Vec<Block>,
    pub checkpoints: Vec<Checkpoint>,
    /// Every execution, in the final manifest. While a build runs the
    /// manifest is rewritten after each block, so it holds none (the
    /// rewrites would grow with the build's history); they are appended to
    /// `executions.jsonl` as they happen, and `complete` is false.
    pub executions: Vec<Execution>,
    /// Whether this is the manifest of a finished build (with every
    /// execution) or an interim one.
    #[serde(default = "complete_default")]
    pub complete: bool,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub duration_s: f64,
    /// How many times this run was started (1 + resumes).
    pub starts: u32,
    pub belay_version: String,
    pub engine_api_version: Option<String>,
    pub host_trust: bool,
}

fn complete_default() -> bool {
    true
}

/// A line of `checkpoints.jsonl`: a checkpoint made, or the checkpoints from
/// `first_stale` on retired by a rollback.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CheckpointRecord {
    Retired { retired_from: u32 },
    Made(Checkpoint),
}

/// The toolchain under a run's workspace (`build/toolchain.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ToolchainLayers {
    /// The blocks, in order, that ran before the repository copy.
    pub blocks: Vec<String>,
    /// Those of them whose checkpoint another build (of this batch, or any
    /// build with the cache on) had made.
    pub shared: Vec<String>,
    /// The image the repository was copied onto.
    pub image: String,
}

/// Keep the checkpoints numbered below `first_stale`.
pub fn retire_checkpoints(list: &mut Vec<Checkpoint>, first_stale: u32) {
    list.retain(|c| {
        c.id.get(..3)
            .and_then(|n| n.parse::<u32>().ok())
            .is_none_or(|n| n < first_stale)
    });
}

/// Add a checkpoint, replacing one of the same id and kind.
pub fn add_checkpoint(list: &mut Vec<Checkpoint>, cp: Checkpoint) {
    list.retain(|c| c.id != cp.id || c.kind != cp.kind);
    list.push(cp);
}

/// The checkpoints a `checkpoints.jsonl` adds up to (a torn last line, from a
/// kill, is skipped).
pub fn replay_checkpoints(text: &str) -> Vec<Checkpoint> {
    let mut list = Vec::new();
    for line in text.lines() {
        match serde_json::from_str::<CheckpointRecord>(line) {
            Ok(CheckpointRecord::Made(cp)) => add_checkpoint(&mut list, cp),
            Ok(CheckpointRecord::Retired { retired_from }) => {
                retire_checkpoints(&mut list, retired_from)
            }
            Err(_) => {}
        }
    }
    list
}

#[cfg(test)]
mod checkpoint_log_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn cp(id: &str) -> String {
        serde_json::to_string(&Checkpoint {
            id: id.into(),
            image_ref: format!("belay:r-{id}"),
            block_id: format!("block-{id}"),
            parent_image_ref: None,
            kind: "success".into(),
            image_id: String::new(),
            created_at: String::new(),
            cached_from: None,
        })
        .unwrap()
    }

    /// Made, retired by a rollback, made again; a torn last line is skipped.
    #[test]
    fn the_log_replays_to_the_live_checkpoints() {
        let text = format!(
            "{}\n{}\n{}\n{{\"retired_from\": 2}}\n{}\n{{\"id\": \"00",
            cp("001-a"),
            cp("002-b"),
            cp("003-c"),
            cp("002-b")
        );
        let ids: Vec<String> = replay_checkpoints(&text)
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(ids, ["001-a", "002-b"]);
    }
}
