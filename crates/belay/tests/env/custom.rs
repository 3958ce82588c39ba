//! Builds from hand-written blocks (`blocks/*.json` of a run id are reused
//! instead of planning), on a tiny unique repository: fast, exact scenarios
//! for the cache and the ablation modes.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::*;

pub struct Custom {
    pub repo: tempfile::TempDir,
    pub state: tempfile::TempDir,
}

impl Custom {
    pub fn new() -> Self {
        let repo = tempfile::tempdir().unwrap();
        // A unique file, so that no other test's checkpoints match this workspace.
        std::fs::write(
            repo.path().join("nonce.txt"),
            format!("{:?} {}", std::time::SystemTime::now(), std::process::id()),
        )
        .unwrap();
        std::fs::write(repo.path().join("README.md"), "a belay test repository\n").unwrap();
        Self {
            repo,
            state: tempfile::tempdir().unwrap(),
        }
    }

    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.state.path().join("runs").join(run)
    }

    /// Write blocks (id, body, validation) for `run`.
    pub fn blocks(&self, run: &str, blocks: &[(&str, &str, &str)]) {
        let dir = self.run_dir(run).join("blocks");
        std::fs::create_dir_all(&dir).unwrap();
        for (order, (id, body, validation)) in blocks.iter().enumerate() {
            let script = format!(
                "#!/usr/bin/env bash\n# belay block {id}: test\n# Goal: test\nset -euo pipefail\nexport DEBIAN_FRONTEND=noninteractive\ncd /workspace/repo\n\n{body}\n"
            );
            let b = json!({
                "id": id, "title": id, "goal": "test", "script": script, "order": order,
                "validation_command": validation, "status": "planned", "last_error": null,
                "baseline_checkpoint": null, "success_checkpoint": null, "repair_attempts": 0
            });
            std::fs::write(
                dir.join(format!("{id}.json")),
                serde_json::to_string_pretty(&b).unwrap(),
            )
            .unwrap();
        }
    }

    /// Copy a run's blocks to a new run id (a new build of the same plan).
    pub fn copy_blocks(&self, from: &str, to: &str) {
        let src = self.run_dir(from).join("blocks");
        let dst = self.run_dir(to).join("blocks");
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let p = e.unwrap().path();
            let mut b: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            b["status"] = json!("planned");
            std::fs::write(
                dst.join(p.file_name().unwrap()),
                serde_json::to_string_pretty(&b).unwrap(),
            )
            .unwrap();
        }
    }

    /// Build `run`; returns (exit code, manifest).
    pub fn build(&self, run: &str, extra: &[&str]) -> (i32, Value) {
        require_engine();
        let a = belay()
            .args(["env", "build", "--repo"])
            .arg(self.repo.path())
            .arg("--state-dir")
            .arg(self.state.path())
            .args(["--run-id", run])
            .args(extra)
            .assert();
        let code = a.get_output().status.code().unwrap_or(-1);
        let path = self.run_dir(run).join("manifest.json");
        assert!(
            Path::new(&path).is_file(),
            "no manifest: {}",
            String::from_utf8_lossy(&a.get_output().stderr)
        );
        (code, read_json(&path))
    }
}
