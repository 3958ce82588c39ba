//! Repair on real repositories: a missing system library is repaired and
//! patched back, and the clean replay passes; an unrepairable repo fails
//! cleanly with its error, full logs, and no container left.

use crate::common::*;

#[test]
fn missing_system_library_is_repaired_patched_back_and_replayed() {
    require_engine();
    let run = run_id("ffi");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let a = belay()
        .args(["env", "build", "--no-cache", "--repo"])
        .arg(fixture("py-native-ffi"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--run-id", &run])
        .assert();
    let m = manifest(state.path(), &run);
    assert!(
        a.get_output().status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&a.get_output().stderr),
        m["error"]
    );
    assert_eq!(m["ok"], true);
    let deps = m["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "30-python-deps")
        .unwrap();
    assert_eq!(deps["status"], "repaired");
    assert_eq!(deps["repair_attempts"], 1);
    // The failure was the real compiler error, and the fix installed libffi-dev.
    let first = phases(&m, "block")
        .into_iter()
        .find(|e| e["block_id"] == "30-python-deps")
        .unwrap();
    assert_ne!(first["exit_code"], 0);
    let log = std::fs::read_to_string(first["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains("ffi.h: No such file or directory"), "{log}");
    let repair = phases(&m, "repair");
    assert_eq!(repair.len(), 1);
    assert!(repair[0]["repair_command"]
        .as_str()
        .unwrap()
        .contains("libffi-dev"));
    // Rollback: the container was recreated from the block's baseline first
    // (the workspace: the toolchain blocks run under the repository copy).
    assert_eq!(
        deps["baseline_checkpoint"]
            .as_str()
            .map(|c| c.ends_with("-000-workspace-success")),
        Some(true)
    );
    assert!(phases(&m, "repair_prep").iter().any(|e| e["command"]
        .as_str()
        .unwrap()
        .contains("000-workspace-success")));
    // Patch-back: the fix is in the final script, and in the block file.
    let script = std::fs::read_to_string(
        state
            .path()
            .join("runs")
            .join(&run)
            .join("scripts/30-python-deps.sh"),
    )
    .unwrap();
    assert!(
        script.contains("# belay repair: missing-c-header") && script.contains("libffi-dev"),
        "{script}"
    );
    assert!(deps["success_checkpoint"]
        .as_str()
        .unwrap()
        .ends_with("-004-30-python-deps-repaired"));
    // The clean replay ran the final scripts (after the unrepaired toolchain) and passed.
    assert_eq!(m["final_clean_replay_ok"], true);
    assert!(m["final_clean_replay_image"]
        .as_str()
        .unwrap()
        .ends_with("-clean-replay"));
    assert!(
        !phases(&m, "clean_replay").is_empty() && !phases(&m, "clean_replay_validation").is_empty()
    );
    assert!(phases(&m, "clean_replay")
        .iter()
        .all(|e| e["exit_code"] == 0));
    // And the final image (the replay's) really has the library linked in.
    project_tests_pass(&m, ".venv/bin/python -m pytest -q", "1 passed");
    assert!(run_containers(&run).is_empty());
}

#[test]
fn unrepairable_repo_fails_cleanly() {
    require_engine();
    let run = run_id("broken");
    let _guard = RunGuard(run.clone());
    let state = tempfile::tempdir().unwrap();
    let a = belay()
        .args(["env", "build", "--no-cache", "--repo"])
        .arg(fixture("py-broken-tests"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--run-id", &run])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    let m = manifest(state.path(), &run);
    assert_eq!(m["ok"], false);
    assert_eq!(m["status"], "failed");
    let block = m["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "50-test-tooling")
        .unwrap();
    assert_eq!(block["status"], "failed");
    let last_error = block["last_error"].as_str().unwrap();
    assert!(
        last_error.contains("validation") && last_error.contains("no repair rule matches"),
        "{last_error}"
    );
    assert!(m["error"].as_str().unwrap().contains("50-test-tooling"));
    // The full log of the failing command is there.
    let v = phases(&m, "validation")
        .into_iter()
        .find(|e| e["block_id"] == "50-test-tooling")
        .unwrap();
    let log = std::fs::read_to_string(v["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains("SyntaxError"), "{log}");
    assert!(m["final_image"].is_null());
    assert!(
        run_containers(&run).is_empty(),
        "containers left: {:?}",
        run_containers(&run)
    );
}
