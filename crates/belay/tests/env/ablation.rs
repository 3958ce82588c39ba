//! Each ablation mode, checked against its documented behaviour on a plan whose
//! second block fails with a real, repairable error (`tree: command not found`,
//! fixed by installing the `tree` package).

use serde_json::Value;

use crate::common::*;
use crate::custom::*;

const BLOCKS: &[(&str, &str, &str)] = &[
    ("00-prep", "echo prep > /tmp/prep", "test -f /tmp/prep"),
    ("20-tool", "echo start\ntree --version", "command -v tree"),
    ("30-after", "echo after", "true"),
];

fn build(mode: &str) -> (i32, Value, String) {
    let c = Custom::new();
    let run = run_id(&format!("abl-{mode}"));
    let guard = RunGuard(run.clone());
    c.blocks(&run, BLOCKS);
    let (code, m) = c.build(&run, &["--no-cache", "--ablation", mode]);
    assert_eq!(m["ablation_mode"], mode);
    drop(guard);
    (code, m, run)
}

fn repaired(m: &Value) {
    assert_eq!(m["ok"], true, "{}", m["error"]);
    assert_eq!(block(m, "20-tool")["status"], "repaired");
    assert!(block(m, "20-tool")["script"]
        .as_str()
        .unwrap()
        .contains("tree"));
    assert!(phases(m, "repair").iter().any(|e| e["repair_command"]
        .as_str()
        .unwrap()
        .contains("apt-get install")));
}

#[test]
fn full() {
    let (code, m, _) = build("full");
    assert_eq!(code, 0);
    repaired(&m);
    let pc = &m["progress_control"];
    for k in [
        "local_repair",
        "patch_back",
        "checkpoint_rollback",
        "final_clean_replay",
    ] {
        assert_eq!(pc[k], true, "{k}");
    }
    assert!(
        !phases(&m, "repair_prep").is_empty(),
        "no rollback to the baseline"
    );
    assert!(!phases(&m, "clean_replay").is_empty(), "no clean replay");
    assert_eq!(m["final_clean_replay_ok"], true);
}

#[test]
fn without_local_repair() {
    let (code, m, _) = build("without-local-repair");
    assert_eq!(code, 1);
    assert_eq!(m["progress_control"]["local_repair"], false);
    assert_eq!(m["progress_control"]["patch_back"], false);
    assert!(phases(&m, "repair").is_empty());
    assert_eq!(block(&m, "20-tool")["status"], "failed");
    assert!(
        m["error"].as_str().unwrap().contains("local repair is off"),
        "{}",
        m["error"]
    );
}

#[test]
fn without_checkpoint_rollback() {
    let (code, m, _) = build("without-checkpoint-rollback");
    assert_eq!(code, 0);
    repaired(&m);
    assert_eq!(m["progress_control"]["checkpoint_rollback"], false);
    assert!(
        phases(&m, "repair_prep").is_empty(),
        "the baseline was restored"
    );
    // The repair ran on top of the failed attempt, so the final scripts are replayed.
    assert!(!phases(&m, "clean_replay").is_empty());
}

#[test]
fn without_final_clean_replay() {
    let (code, m, _) = build("without-final-clean-replay");
    assert_eq!(code, 0);
    repaired(&m);
    assert_eq!(m["final_clean_replay_enabled"], false);
    assert!(phases(&m, "clean_replay").is_empty());
    assert!(m["final_image"].is_string());
}

#[test]
fn single_command_forward() {
    let (code, m, _) = build("single-command-forward");
    assert_eq!(code, 0);
    repaired(&m);
    assert_eq!(m["progress_control"]["forward_granularity"], "command");
    let cmds: Vec<&str> = phases(&m, "command_forward")
        .iter()
        .map(|e| e["command"].as_str().unwrap())
        .collect();
    assert!(
        cmds.contains(&"echo start") && cmds.contains(&"tree --version"),
        "{cmds:?}"
    );
    // Forward never ran a whole block script; recovery (block level) did.
    assert!(phases(&m, "block")
        .iter()
        .all(|e| e["block_id"] == "20-tool"));
}

#[test]
fn single_command_recovery() {
    let (code, m, _) = build("single-command-recovery");
    assert_eq!(code, 0);
    repaired(&m);
    assert_eq!(m["progress_control"]["recovery_granularity"], "command");
    let rec: Vec<&str> = phases(&m, "command_recovery")
        .iter()
        .map(|e| e["command"].as_str().unwrap())
        .collect();
    assert!(rec.contains(&"tree --version"), "{rec:?}");
    assert!(
        phases(&m, "repair_prep").is_empty(),
        "recovery must stay in the live container"
    );
}

#[test]
fn whole_script_forward() {
    let (code, m, _) = build("whole-script-forward");
    assert_eq!(code, 0);
    assert_eq!(m["progress_control"]["forward_granularity"], "whole_script");
    let whole = phases(&m, "whole_script");
    assert_eq!(whole.len(), 1);
    assert_ne!(
        whole[0]["exit_code"], 0,
        "the whole script should have failed at tree"
    );
    // It fell back to block-level execution with recovery.
    repaired(&m);
}

#[test]
fn whole_script_recovery() {
    let (code, m, _) = build("whole-script-recovery");
    assert_eq!(code, 0);
    repaired(&m);
    assert_eq!(
        m["progress_control"]["recovery_granularity"],
        "whole_script"
    );
    let rec = phases(&m, "whole_script_recovery");
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0]["exit_code"], 0);
}

/// A block that needs two fixes, one revealed after the other: the second round
/// runs the first round's fix again (after the rollback) plus its own, and both
/// are patched back, in order.
#[test]
fn repair_rounds_accumulate_fixes() {
    let c = Custom::new();
    let run = run_id("accumulate");
    let _guard = RunGuard(run.clone());
    c.blocks(
        &run,
        &[(
            "20-tools",
            "tree --version\njq --version",
            "command -v tree && command -v jq",
        )],
    );
    let (code, m) = c.build(
        &run,
        &["--no-cache", "--ablation", "without-final-clean-replay"],
    );
    assert_eq!(code, 0, "{}", m["error"]);
    let b = block(&m, "20-tools");
    assert_eq!(b["status"], "repaired");
    assert_eq!(b["repair_attempts"], 2);
    let script = b["script"].as_str().unwrap();
    let (t, j) = (
        script.find("install").and_then(|_| script.find(" tree")),
        script.find(" jq"),
    );
    assert!(
        t.is_some() && j.is_some() && t < j,
        "both fixes, in order:\n{script}"
    );
    let last = phases(&m, "repair").last().unwrap()["repair_command"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        last.contains("tree") && last.contains("jq"),
        "the second round must rerun the first fix: {last}"
    );
}
