//! `kill -9` mid-build, then the same command with the same run id finishes the
//! build from the last checkpoint, and no belay container is left afterwards.

use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn kill_9_mid_build_then_rerun_completes() {
    require_engine();
    let run = run_id("kill");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let args = |c: &mut std::process::Command| {
        c.args(["env", "build", "--repo"])
            .arg(fixture("py-pyproject"))
            .arg("--state-dir")
            .arg(state.path())
            .args(["--run-id", &run, "--no-cache", "--planner", "rules"]);
    };
    let mut cmd = std::process::Command::new(belay_path());
    args(&mut cmd);
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until two blocks are checkpointed and a third is running.
    wait_for_blocks(&mut child, state.path(), &run, 2);
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !run_containers(&run).is_empty(),
        "the killed run should have left its container behind"
    );
    let killed = manifest(state.path(), &run);
    assert_eq!(
        killed["status"], "running",
        "the manifest of a killed run still says running"
    );
    // An interim manifest: its executions are in executions.jsonl.
    assert_eq!(killed["complete"], false);
    assert_eq!(killed["executions"].as_array().map(Vec::len), Some(0));

    let mut again = belay();
    again
        .args(["env", "build", "--repo"])
        .arg(fixture("py-pyproject"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--run-id", &run, "--no-cache"]);
    let a = again.assert();
    let out = a.get_output();
    assert!(
        out.status.success(),
        "rerun failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = manifest(state.path(), &run);
    assert_eq!(m["ok"], true, "{}", m["error"]);
    assert_eq!(m["starts"], 2);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("resuming from checkpoint"), "{stderr}");
    assert!(
        stderr.contains("reaper: removed"),
        "the rerun should reap the killed run's container:\n{stderr}"
    );
    // Checkpointed blocks were not run again.
    let preflight_runs = m["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["block_id"] == "00-preflight" && e["phase"] == "block")
        .count();
    assert_eq!(preflight_runs, 1, "00-preflight ran again after resume");
    assert!(
        run_containers(&run).is_empty(),
        "containers left: {:?}",
        run_containers(&run)
    );
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "2 passed");
}

/// Ctrl-C in the middle of a block: belay stops cleanly (exit 130), removes
/// its container, records the run as interrupted, and the same command
/// resumes from the last checkpoint without running a checkpointed block
/// again.
#[test]
fn sigint_mid_build_leaves_no_container_and_the_same_command_resumes() {
    require_engine();
    let run = run_id("sigint");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let command = || {
        let mut c = std::process::Command::new(belay_path());
        c.args(["env", "build", "--repo"])
            .arg(fixture("py-pyproject"))
            .arg("--state-dir")
            .arg(state.path())
            .args(["--run-id", &run, "--no-cache", "--planner", "rules"])
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1");
        c
    };
    let mut child = command()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_blocks(&mut child, state.path(), &run, 1);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the stop took {:?}",
        t.elapsed()
    );
    assert!(stderr.contains("BELAY-E130"), "{stderr}");
    assert!(stderr.contains("the same command resumes"), "{stderr}");
    assert!(!stderr.contains("cannot remove"), "{stderr}");
    assert!(
        run_containers(&run).is_empty(),
        "Ctrl-C left containers: {:?}",
        run_containers(&run)
    );
    let stopped = manifest(state.path(), &run);
    assert_eq!(stopped["status"], "interrupted");
    let events =
        std::fs::read_to_string(state.path().join("runs").join(&run).join("events.jsonl")).unwrap();
    assert!(events.contains("\"run_interrupted\""), "{events}");

    let again = command().output().unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "rerun failed:\n{stderr}");
    assert!(stderr.contains("resuming from checkpoint"), "{stderr}");
    let m = manifest(state.path(), &run);
    assert_eq!(m["ok"], true, "{}", m["error"]);
    let preflight_runs = m["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["block_id"] == "00-preflight" && e["phase"] == "block")
        .count();
    assert_eq!(preflight_runs, 1, "00-preflight ran again after the resume");
    assert!(run_containers(&run).is_empty());
}

/// Wait until `done` blocks of `run` are checkpointed and the next one is
/// running (while a build runs, each block's state is in blocks/<id>.json).
fn wait_for_blocks(
    child: &mut std::process::Child,
    state: &std::path::Path,
    run: &str,
    done: usize,
) {
    let blocks_dir = state.join("runs").join(run).join("blocks");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        assert!(
            Instant::now() < deadline,
            "the build never reached block {}",
            done + 1
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("belay exited ({status}) before it could be stopped");
        }
        let blocks: Vec<serde_json::Value> = std::fs::read_dir(&blocks_dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .filter_map(|t| serde_json::from_str(&t).ok())
                    .collect()
            })
            .unwrap_or_default();
        let ok = blocks.iter().filter(|b| b["status"] == "succeeded").count();
        if ok >= done && blocks.iter().any(|b| b["status"] == "running") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
