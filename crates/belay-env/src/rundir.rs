//! The layout of `<state-dir>/runs/<run-id>/`.

use std::path::{Path, PathBuf};

use crate::EnvError;

#[derive(Debug, Clone)]
pub struct RunDir {
    pub state_dir: PathBuf,
    pub run_id: String,
    pub root: PathBuf,
}

impl RunDir {
    pub fn new(state_dir: &Path, run_id: &str) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            run_id: run_id.to_string(),
            root: state_dir.join("runs").join(run_id),
        }
    }

    /// Create the directory tree, failing with a clear message when the state
    /// directory cannot be written.
    pub fn create(&self) -> Result<(), EnvError> {
        for d in [
            self.root.clone(),
            self.blocks_dir(),
            self.scripts_dir(),
            self.logs_dir(),
        ] {
            fs_err::create_dir_all(&d).map_err(|e| EnvError::StateDir {
                path: self.state_dir.clone(),
                reason: format!("cannot create {}: {e}", d.display()),
            })?;
        }
        let probe = self.root.join(".write-test");
        fs_err::write(&probe, b"ok").map_err(|e| EnvError::StateDir {
            path: self.state_dir.clone(),
            reason: format!("cannot write in {}: {e}", self.root.display()),
        })?;
        let _ = fs_err::remove_file(probe);
        Ok(())
    }

    pub fn context(&self) -> PathBuf {
        self.root.join("context.json")
    }
    pub fn blocks_dir(&self) -> PathBuf {
        self.root.join("blocks")
    }
    pub fn scripts_dir(&self) -> PathBuf {
        self.root.join("scripts")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn executions(&self) -> PathBuf {
        self.root.join("executions.jsonl")
    }
    /// The checkpoints as they are made (and retired by a rollback).
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints.jsonl")
    }
    pub fn containers(&self) -> PathBuf {
        self.root.join("containers.jsonl")
    }
    pub fn llm_usage(&self) -> PathBuf {
        self.root.join("llm-usage.json")
    }
    pub fn manifest(&self) -> PathBuf {
        self.root.join("manifest.json")
    }
    pub fn dockerfile(&self) -> PathBuf {
        self.root.join("Dockerfile")
    }
    /// The written Dockerfile for the legacy builder (no `RUN --mount`).
    pub fn dockerfile_legacy(&self) -> PathBuf {
        self.root.join("Dockerfile.legacy")
    }
    pub fn ca_bundle(&self) -> PathBuf {
        self.root.join("belay-ca.crt")
    }
    pub fn lock(&self) -> PathBuf {
        self.root.join("run.lock")
    }
    /// `logs/<block>/<phase>-attempt-N.log`
    pub fn log_path(&self, block: &str, phase: &str, attempt: u32) -> PathBuf {
        self.logs_dir()
            .join(block)
            .join(format!("{phase}-attempt-{attempt}.log"))
    }
}

/// The machine's cache directory (preflight results, passed oracles, the
/// Debian Contents index, the package download caches): `$BELAY_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/belay`, else `~/.cache/belay`, else
/// `<state-dir>/cache`.
pub fn machine_cache_dir(state_dir: &Path) -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("BELAY_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("belay")))
        .or_else(|| env("HOME").map(|h| h.join(".cache").join("belay")))
        .unwrap_or_else(|| state_dir.join("cache"))
}
