//! The block loop's bookkeeping on [`FakeRuntime`] (no container engine):
//! checkpoints, executions, block states, the manifest, and a resume after
//! the engine failed mid-build. The real builds are tested end to end on the
//! real engine in `crates/belay/tests/env`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use belay_sandbox::fake::{Answer, FakeRuntime};
use serde_json::{json, Value};

use crate::build::{build, BuildOptions};
use crate::progress::NoopBuildObserver;

struct Ws {
    tmp: tempfile::TempDir,
}

impl Ws {
    /// A repository and, for run `run`, hand-written blocks b0..bN.
    fn new(run: &str, n: usize) -> Ws {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("repo")).unwrap();
        std::fs::write(tmp.path().join("repo/README.md"), "x\n").unwrap();
        let dir = tmp.path().join("state/runs").join(run).join("blocks");
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..n {
            let id = format!("b{i}");
            let b = json!({"id": id, "title": id, "goal": "g", "order": i,
                "script": format!("#!/usr/bin/env bash\n# belay block {id}: t\nset -euo pipefail\ntrue\n"),
                "validation_command": format!("check-{id}"), "status": "planned", "last_error": null,
                "baseline_checkpoint": null, "success_checkpoint": null, "repair_attempts": 0});
            std::fs::write(dir.join(format!("{id}.json")), b.to_string()).unwrap();
        }
        Ws { tmp }
    }

    fn opts(&self, run: &str) -> BuildOptions {
        let mut o = BuildOptions::new(self.tmp.path().join("repo"));
        o.state_dir = Some(self.tmp.path().join("state"));
        o.run_id = Some(run.into());
        o.host_trust = false;
        o.cache = false;
        o.max_repair_attempts = 0;
        o
    }

    fn manifest(&self, run: &str) -> Value {
        let p = self
            .tmp
            .path()
            .join("state/runs")
            .join(run)
            .join("manifest.json");
        // host-owned: a test's own temporary run dir (test-only module).
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }
}

fn ran(rt: &FakeRuntime, what: &str) -> usize {
    rt.execs()
        .iter()
        .filter(|a| a.iter().any(|x| x.ends_with(&format!("/{what}.sh"))))
        .count()
}

/// Three blocks: a checkpoint each, a block and a validation record each,
/// every block file succeeded, and a final manifest that holds it all.
#[tokio::test]
async fn every_block_is_checkpointed_and_recorded() {
    let ws = Ws::new("r1", 3);
    let rt = FakeRuntime::new(|_| Answer::Exit(0, String::new()));
    let out = build(&rt, &ws.opts("r1"), &NoopBuildObserver)
        .await
        .unwrap();
    assert!(out.manifest.ok, "{:?}", out.manifest.error);
    let m = ws.manifest("r1");
    assert_eq!(m["complete"], true);
    let cps: Vec<&str> = m["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["block_id"].as_str().unwrap())
        .collect();
    for b in ["b0", "b1", "b2"] {
        assert!(cps.contains(&b), "no checkpoint of {b}: {cps:?}");
        assert_eq!(ran(&rt, b), 1, "{b} ran more than once");
    }
    let phases: Vec<(String, String)> = m["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["block_id"].as_str().unwrap().into(),
                e["phase"].as_str().unwrap().into(),
            )
        })
        .collect();
    for b in ["b0", "b1", "b2"] {
        assert!(phases.contains(&(b.into(), "block".into())), "{phases:?}");
        assert!(
            phases.contains(&(b.into(), "validation".into())),
            "{phases:?}"
        );
    }
    for b in ["b0", "b1", "b2"] {
        let f = ws.tmp.path().join(format!("state/runs/r1/blocks/{b}.json"));
        // host-owned: a test's own temporary run dir (test-only module).
        let v: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        assert_eq!(v["status"], "succeeded", "{b}");
    }
    assert!(m["final_image"].as_str().unwrap().ends_with("r1-final"));
}

/// A validation that fails (no repair allowed) fails the build at that block,
/// names it, and runs nothing after it.
#[tokio::test]
async fn a_failing_validation_stops_the_build_at_its_block() {
    let ws = Ws::new("r2", 3);
    let rt = FakeRuntime::new(|argv| {
        let code = i64::from(argv.iter().any(|a| a.contains("check-b1")));
        Answer::Exit(code, String::new())
    });
    let out = build(&rt, &ws.opts("r2"), &NoopBuildObserver)
        .await
        .unwrap();
    assert!(!out.manifest.ok);
    assert!(out
        .manifest
        .error
        .clone()
        .unwrap_or_default()
        .contains("b1"));
    assert_eq!(ran(&rt, "b2"), 0, "a block after the failure ran");
    let f = ws.tmp.path().join("state/runs/r2/blocks/b1.json");
    // host-owned: a test's own temporary run dir (test-only module).
    let v: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
    assert_eq!(v["status"], "failed");
}

/// The engine fails under block b2: the build stops with an engine error and
/// an interim manifest; the same command again resumes after b1's checkpoint
/// (b0 and b1 do not run again) and keeps the first start's executions.
#[tokio::test]
async fn an_engine_failure_mid_build_resumes_from_the_last_checkpoint() {
    let ws = Ws::new("r3", 3);
    let down = Arc::new(AtomicBool::new(true));
    let d = down.clone();
    let rt = FakeRuntime::new(move |argv| {
        if d.load(Ordering::SeqCst) && argv.iter().any(|a| a.ends_with("/b2.sh")) {
            Answer::EngineGone
        } else {
            Answer::Exit(0, String::new())
        }
    });
    let err = build(&rt, &ws.opts("r3"), &NoopBuildObserver)
        .await
        .unwrap_err();
    assert_eq!(
        belay_record::Classify::exit_class(&err),
        belay_record::ExitClass::Infra,
        "{err}"
    );
    down.store(false, Ordering::SeqCst);
    let out = build(&rt, &ws.opts("r3"), &NoopBuildObserver)
        .await
        .unwrap();
    assert!(out.manifest.ok, "{:?}", out.manifest.error);
    assert_eq!(out.manifest.starts, 2);
    assert_eq!(ran(&rt, "b0"), 1, "b0 ran again after the resume");
    assert_eq!(ran(&rt, "b1"), 1, "b1 ran again after the resume");
    assert_eq!(ran(&rt, "b2"), 2);
    let m = ws.manifest("r3");
    let b0_records = m["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["block_id"] == "b0" && e["phase"] == "block")
        .count();
    assert_eq!(b0_records, 1, "the first start's executions were lost");
    // The first start's checkpoints came back from checkpoints.jsonl.
    let cps: Vec<&str> = m["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["block_id"].as_str().unwrap())
        .collect();
    assert!(
        cps.contains(&"b0") && cps.contains(&"b1") && cps.contains(&"b2"),
        "{cps:?}"
    );
}

/// The one stop token trips while b1 runs: b2 never starts, the build ends
/// interrupted (exit 130) with every container it made removed and the
/// registry's run interrupted; the same command resumes at b2. The event
/// kinds of both starts are a snapshot.
#[tokio::test]
async fn a_stop_mid_build_removes_its_containers_and_the_same_command_resumes() {
    let ws = Ws::new("r4", 3);
    let mut opts = ws.opts("r4");
    let stop = belay_record::Stop::new();
    opts.stop = stop.clone();
    let rt = FakeRuntime::new(move |argv| {
        if argv.iter().any(|a| a.ends_with("/b1.sh")) {
            stop.trip("SIGINT received");
        }
        Answer::Exit(0, String::new())
    });
    let err = build(&rt, &opts, &NoopBuildObserver).await.unwrap_err();
    assert_eq!(
        belay_record::Classify::exit_class(&err),
        belay_record::ExitClass::Interrupted,
        "{err}"
    );
    assert!(
        err.to_string().contains("the same command resumes"),
        "{err}"
    );
    assert_eq!(ran(&rt, "b2"), 0);
    let created = rt.created().len();
    assert!(created > 0);
    assert_eq!(
        rt.removed().len(),
        created,
        "containers left: removed {:?}",
        rt.removed()
    );
    assert_eq!(ws.manifest("r4")["status"], "interrupted");
    let out = build(&rt, &ws.opts("r4"), &NoopBuildObserver)
        .await
        .unwrap();
    assert!(out.manifest.ok, "{:?}", out.manifest.error);
    assert_eq!((ran(&rt, "b0"), ran(&rt, "b1"), ran(&rt, "b2")), (1, 1, 1));
    let events = std::fs::read_to_string(ws.tmp.path().join("state/runs/r4/events.jsonl")).unwrap();
    let kinds: Vec<String> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| {
            format!(
                "{} {}",
                e["step"].as_str().unwrap_or("-"),
                e["kind"].as_str().unwrap_or("?")
            )
        })
        .collect();
    insta::assert_json_snapshot!("env_stop_and_resume_kinds", kinds);
}
