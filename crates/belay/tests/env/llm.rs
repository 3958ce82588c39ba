//! `--planner llm` against `belay model replay`: the scripted plan is used, a
//! scripted repair (after a probe) fixes a failing block, bad answers get one
//! correction and then the rules, and the API key never reaches a file.

use crate::common::*;

const CANARY: &str = "sk-canary-9f8e7d6c5b4a39281706";

const PLAN_AND_REPAIR: &str = r#"
turns:
  - name: plan
    match: {contains: "Plan the environment setup"}
    reply:
      json:
        blocks:
          - id: 10-system-packages
            title: Demo base
            goal: a directory the next block uses
            commands: ["mkdir -p /opt/demo", "echo base > /opt/demo/base.txt"]
            validation_command: test -f /opt/demo/base.txt
          - id: 30-project-deps
            title: Demo deps
            commands:
              - "test -f /opt/demo/ready || { echo 'demo: /opt/demo/ready is missing' >&2; exit 1; }"
              - "echo deps > /opt/demo/deps.txt"
            validation_command: test -f /opt/demo/deps.txt
  - name: probe first
    match: {contains: "Block 30-project-deps", not_contains: "Probe results"}
    reply:
      json: {diagnosis: "look first", probes: ["ls -la /opt/demo"], fix: null, blame: null}
  - name: the fix
    match: {contains: "Probe results"}
    reply:
      json: {diagnosis: "the ready marker is missing", fix: "touch /opt/demo/ready", blame: null}
"#;

#[test]
fn llm_plan_and_repair_against_the_replay_server() {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let replay = Replay::start(tmp.path(), PLAN_AND_REPAIR);
    let state = tmp.path().join("state");
    let run = run_id("llm");
    let _guard = RunGuard(run.clone());
    belay()
        .args(["env", "build", "--repo"])
        .arg(fixture("empty-repo"))
        .arg("--state-dir")
        .arg(&state)
        .args([
            "--run-id",
            &run,
            "--no-cache",
            "--planner",
            "llm",
            "--model",
            "replay-model",
        ])
        .args(["--openai-base-url", &replay.openai_base()])
        .env("OPENAI_API_KEY", CANARY)
        .assert()
        .success();
    let m = manifest(&state, &run);
    assert_eq!(m["ok"], true, "{m:#}");
    let ids: Vec<&str> = m["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["10-system-packages", "30-project-deps"],
        "the scripted plan was not used"
    );
    let deps = block(&m, "30-project-deps");
    assert_eq!(deps["status"], "repaired");
    assert!(
        deps["script"]
            .as_str()
            .unwrap()
            .contains("touch /opt/demo/ready"),
        "the fix was not patched back"
    );
    // The probe ran in the container, and the model saw its output.
    let probes = phases(&m, "llm_probe");
    assert_eq!(probes.len(), 1);
    assert_eq!(probes[0]["command"], "ls -la /opt/demo");
    let reqs = replay.requests();
    assert_eq!(reqs.len(), 3, "plan, repair, repair after probes");
    assert!(
        reqs[2]["body"].to_string().contains("base.txt"),
        "probe output missing from the second repair request"
    );
    // The repair request carries the failed block's log.
    assert!(reqs[1]["body"]
        .to_string()
        .contains("/opt/demo/ready is missing"));
    assert_eq!(phases(&m, "llm_repair").len(), 1);
    assert_eq!(phases(&m, "llm_plan").len(), 1);
    // The final image passes a clean replay of the patched scripts.
    assert_eq!(m["final_clean_replay_ok"], true);
    // Usage: every call, in llm-usage.json and the manifest.
    let usage = read_json(&state.join("runs").join(&run).join("llm-usage.json"));
    assert_eq!(usage["requests"], 3);
    assert_eq!(usage["planner"], "llm");
    assert_eq!(usage["model"], "replay-model");
    assert!(usage["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(m["llm_usage"]["requests"], 3);
    // The key: sent to the server, written nowhere.
    assert!(
        files_containing(&state, CANARY).is_empty(),
        "{:?}",
        files_containing(&state, CANARY)
    );
    assert!(
        files_containing(tmp.path(), CANARY).is_empty(),
        "{:?}",
        files_containing(tmp.path(), CANARY)
    );
}

/// Garbage, then a schema violation: one correction, then the rules plan, with
/// the reason in the output and the usage file. No Docker needed.
#[test]
fn bad_model_output_gets_one_correction_then_the_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let replay = Replay::start(
        tmp.path(),
        r#"
turns:
  - reply: {text: "Here is my plan: first install things, then test."}
  - match: {contains: "could not be used"}
    reply:
      json: {blocks: [{id: "setup", title: "x", commands: ["true"], validation_command: "true"}]}
"#,
    );
    let out = tmp.path().join("plan");
    let a = belay()
        .args(["env", "plan", "--repo"])
        .arg(fixture("py-pyproject"))
        .arg("--out")
        .arg(&out)
        .args([
            "--planner",
            "llm",
            "--openai-base-url",
            &replay.openai_base(),
            "--llm-api",
            "chat-completions",
        ])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    let stdout = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(
        stderr.contains("answer 1 rejected: the answer is not the JSON object"),
        "{stderr}"
    );
    assert!(
        stderr.contains("id `setup` is not NN-kebab-name"),
        "{stderr}"
    );
    assert!(
        stderr.contains("falling back to the rules planner"),
        "{stderr}"
    );
    assert!(stdout.contains("planner: rules (llm fallback)"), "{stdout}");
    assert!(
        stdout.contains("30-python-deps"),
        "the rules plan was not written: {stdout}"
    );
    assert_eq!(replay.requests().len(), 2, "exactly one correction");
    let usage = read_json(&out.join("llm-usage.json"));
    assert_eq!(usage["requests"], 2);
    assert_eq!(usage["api"], "chat-completions");
}

/// `auto` plans with the rules when no model is configured; `llm` without one
/// is a usage error that says what to set.
#[test]
fn planner_auto_and_missing_model_settings() {
    let tmp = tempfile::tempdir().unwrap();
    belay()
        .args(["env", "plan", "--repo"])
        .arg(fixture("py-pyproject"))
        .arg("--out")
        .arg(tmp.path())
        .assert()
        .success()
        .stdout(predicates::str::contains("planner: rules"));
    belay()
        .current_dir(tmp.path())
        .args(["env", "plan", "--planner", "llm", "--repo"])
        .arg(fixture("py-pyproject"))
        .assert()
        .code(2)
        .stderr(predicates::str::contains("set OPENAI_API_KEY"));
}
