//! The files a round leaves in the log dir, as the peer names them:
//! `status.json`, `round-context.json`, `orphan-state.json`. Each is written
//! atomically (a crash leaves the old file or the new one) and redacted.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::RoundsError;

pub const STATUS_FILE: &str = "status.json";
pub const CONTEXT_FILE: &str = "round-context.json";
pub const ORPHAN_FILE: &str = "orphan-state.json";
pub const DAY_FILE: &str = "usage-day.json";

/// `status.json`: `running` is true exactly while a round runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub round_num: u64,
    pub running: bool,
    #[serde(default)]
    pub current_phase: Option<String>,
    #[serde(default)]
    pub phase_index: usize,
    /// When the running round started.
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub last_completed_at: Option<String>,
    #[serde(default)]
    pub last_exit_code: Option<i32>,
    #[serde(default)]
    pub last_duration_s: Option<f64>,
    /// How the last round ended: clean, failed, timed_out, killed,
    /// interrupted, limit.
    #[serde(default)]
    pub last_outcome: Option<String>,
    /// The process running the round (pid, start time, boot).
    #[serde(default)]
    pub holder: Option<belay_record::ProcessIdentity>,
    /// The last round hit a rate limit (and none has run clean since).
    #[serde(default)]
    pub transient_active: bool,
}

/// One stash a round left, named by its SHA.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Orphan {
    #[serde(rename = "ref")]
    pub sha: String,
    pub message: String,
    pub files: Vec<String>,
    pub round_num: u64,
    /// How the round that left it ended.
    pub outcome: String,
    pub phase: Option<String>,
    pub timestamp: String,
    /// What was stashed (paths and contents), for the idempotency check.
    #[serde(default)]
    pub fingerprint: String,
}

/// `orphan-state.json`: every stash not yet applied or dropped, oldest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OrphanState {
    pub stashes: Vec<Orphan>,
}

/// `previous` in the round context.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Previous {
    pub round_num: u64,
    pub exit_code: Option<i32>,
    pub duration_s: Option<f64>,
    pub ended_at: Option<String>,
    pub outcome: String,
    pub had_dirty_tree: bool,
}

/// `orphan_stash` (the peer's single block) and belay's full list.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OrphanBlock {
    #[serde(rename = "ref")]
    pub sha: String,
    pub message: String,
    pub files: Vec<String>,
    pub round_num: u64,
    pub outcome: String,
}

impl From<&Orphan> for OrphanBlock {
    fn from(o: &Orphan) -> Self {
        OrphanBlock {
            sha: o.sha.clone(),
            message: o.message.clone(),
            files: o.files.clone(),
            round_num: o.round_num,
            outcome: o.outcome.clone(),
        }
    }
}

/// `round-context.json`, and the block prepended to the prompt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoundContext {
    pub round_num: u64,
    pub started_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
    /// The newest outstanding stash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphan_stash: Option<OrphanBlock>,
    /// Every outstanding stash, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub orphan_stashes: Vec<OrphanBlock>,
}

/// Usage of the current UTC day, against the day limits.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DayUsage {
    pub day: String,
    pub cost_usd: f64,
    pub turns: u64,
    pub rounds: u64,
}

/// A state file of the log dir that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Torn or hand-edited: the file and line.
    #[error("{}:{}: {source}", path.display(), source.line())]
    Json {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl belay_record::Classify for StateFileError {
    fn exit_class(&self) -> belay_record::ExitClass {
        match self {
            StateFileError::Io { source, .. } => belay_record::io_class(source),
            StateFileError::Json { .. } => belay_record::ExitClass::Usage,
        }
    }
}

/// Read a JSON file of the log dir: `Ok(None)` when it is missing, `Err`
/// with the file and line when it does not parse.
pub fn read<T: serde::de::DeserializeOwned>(
    dir: &Path,
    name: &str,
) -> Result<Option<T>, StateFileError> {
    let path = dir.join(name);
    // host-owned: the log dir, belay's own (the battery refuses one inside the work tree).
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|source| StateFileError::Json { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateFileError::Io { path, source }),
    }
}

/// Write a JSON file of the log dir atomically, mode 0600, redacted.
pub fn write<T: Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
    redactor: &belay_record::Redactor,
) -> Result<(), RoundsError> {
    let path = dir.join(name);
    let mut v = serde_json::to_value(value)
        .map_err(|e| RoundsError::io("cannot encode", &path, std::io::Error::other(e)))?;
    redactor.redact_value(&mut v);
    let text = serde_json::to_string_pretty(&v)
        .map_err(|e| RoundsError::io("cannot encode", &path, std::io::Error::other(e)))?;
    belay_record::atomic_write(&path, text.as_bytes())?;
    Ok(())
}
