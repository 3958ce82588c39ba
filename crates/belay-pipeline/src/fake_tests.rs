//! The engine's state machine on [`FakeRuntime`]: routing, attempts and
//! resume, with real git and real files but no container engine. The
//! end-to-end behaviour is tested on the real engine in `crates/belay/tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use belay_sandbox::fake::{Answer, FakeRuntime};
use belay_sandbox::ContainerRuntime;

use crate::engine::{Engine, RunOptions};
use crate::state::Status;

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok, "git {args:?}");
}

struct Ws {
    tmp: tempfile::TempDir,
}

impl Ws {
    fn new(pipeline: &str) -> Ws {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("pipeline.yaml"), pipeline).unwrap();
        git(&ws, &["init", "-q", "-b", "main"]);
        git(&ws, &["add", "-A"]);
        git(&ws, &["commit", "-q", "-m", "init"]);
        Ws { tmp }
    }

    fn opts(&self, resume: Option<String>) -> RunOptions {
        RunOptions {
            resume,
            state_dir: Some(self.tmp.path().join("state")),
            registry: Some(self.tmp.path().join("registry")),
            ..RunOptions::default()
        }
    }

    async fn run(
        &self,
        rt: &FakeRuntime,
        resume: Option<String>,
    ) -> Result<crate::engine::Outcome, crate::PipelineError> {
        self.run_with(rt, resume, None).await
    }

    async fn run_with(
        &self,
        rt: &FakeRuntime,
        resume: Option<String>,
        stop: Option<belay_record::Stop>,
    ) -> Result<crate::engine::Outcome, crate::PipelineError> {
        let p = crate::load(&self.tmp.path().join("ws/pipeline.yaml")).unwrap();
        let rt: Arc<dyn ContainerRuntime> = Arc::new(rt.clone());
        let mut opts = self.opts(resume);
        opts.stop = stop;
        let e = Engine::start(&p, rt, &opts).await?;
        e.run().await
    }

    /// The kinds of the run's events, in order.
    fn kinds(&self, id: &str) -> Vec<String> {
        let path = self
            .tmp
            .path()
            .join("state/runs")
            .join(id)
            .join("events.jsonl");
        // host-owned: a test's own temporary state dir (test-only module).
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|e| {
                format!(
                    "{} {}",
                    e["step"].as_str().unwrap_or("-"),
                    e["kind"].as_str().unwrap_or("?")
                )
            })
            .collect()
    }

    fn run_id(&self) -> String {
        let runs = self.tmp.path().join("state/runs");
        // host-owned: a test's own temporary state dir (test-only module).
        let mut ids: Vec<String> = std::fs::read_dir(runs)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        ids.sort();
        ids.pop().unwrap()
    }
}

const LOOP: &str = "name: loop\ndeps_policy: open\nmax_attempts: 3\nsteps:\n  - name: work\n    command: echo work\n    on_pass: gate\n  - name: gate\n    command: echo gate\n    on_fail: {goto: work, retry: true}\n";

/// A failing gate routes back to `work` and spends an attempt; the third
/// attempt's pass ends the run.
#[tokio::test]
async fn a_failing_gate_routes_back_and_spends_an_attempt() {
    let ws = Ws::new(LOOP);
    let gates = Arc::new(AtomicUsize::new(0));
    let g = gates.clone();
    let rt = FakeRuntime::new(move |argv| {
        if argv.last().is_some_and(|c| c == "echo gate") {
            let n = g.fetch_add(1, Ordering::SeqCst);
            return Answer::Exit(if n < 2 { 1 } else { 0 }, String::new());
        }
        Answer::Exit(0, String::new())
    });
    let out = ws.run(&rt, None).await.unwrap();
    assert_eq!(out.status, Status::Succeeded);
    assert_eq!(out.attempts, 3);
    assert_eq!(
        rt.commands(),
        [
            "echo work",
            "echo gate",
            "echo work",
            "echo gate",
            "echo work",
            "echo gate"
        ]
    );
    assert_eq!(out.step_runs, 6);
}

/// Attempts run out: the run fails after max_attempts, and says why.
#[tokio::test]
async fn exhausted_attempts_fail_the_run() {
    let ws = Ws::new(LOOP);
    let rt = FakeRuntime::new(|argv| {
        let code = if argv.last().is_some_and(|c| c == "echo gate") {
            1
        } else {
            0
        };
        Answer::Exit(code, String::new())
    });
    let out = ws.run(&rt, None).await.unwrap();
    assert_eq!(out.status, Status::Failed);
    assert_eq!(out.attempts, 3);
    assert_eq!(rt.commands().len(), 6);
    assert!(out.failure.unwrap_or_default().contains("gate"));
}

/// The engine fails under a step: the run stays resumable, and its resume
/// starts at that step (not at the first), with the attempt it was on.
#[tokio::test]
async fn an_engine_failure_leaves_a_run_that_resumes_at_its_step() {
    let ws = Ws::new(LOOP);
    let down = FakeRuntime::new(|argv| {
        if argv.last().is_some_and(|c| c == "echo gate") {
            Answer::EngineGone
        } else {
            Answer::Exit(0, String::new())
        }
    });
    let err = ws.run(&down, None).await.unwrap_err();
    assert_eq!(
        belay_record::Classify::exit_class(&err),
        belay_record::ExitClass::Infra,
        "{err}"
    );
    let id = ws.run_id();
    let st: crate::state::RunState =
        belay_record::RunHandle::load_state(&ws.tmp.path().join("state/runs").join(&id))
            .unwrap()
            .unwrap();
    assert_eq!(st.status, Status::Running);
    assert_eq!(st.current.as_deref(), Some("gate"));
    let up = FakeRuntime::new(|_| Answer::Exit(0, String::new()));
    let out = ws.run(&up, Some(id.clone())).await.unwrap();
    assert_eq!(out.status, Status::Succeeded);
    assert_eq!(out.run_id, id);
    assert_eq!(up.commands(), ["echo gate"]);
    // A finished run is not resumed again.
    let again = ws.run(&up, Some(id)).await.unwrap_err();
    assert!(again.to_string().contains("already ended"), "{again}");
}

/// The one stop token trips while `work` runs: `gate` never starts, the
/// run ends interrupted (exit 130) and names its resume; the resume runs
/// `gate` only. The event kinds of both starts are a snapshot.
#[tokio::test]
async fn a_stop_ends_the_run_interrupted_and_the_resume_goes_on() {
    let ws = Ws::new(LOOP);
    let stop = belay_record::Stop::new();
    let trip = stop.clone();
    let rt = FakeRuntime::new(move |argv| {
        if argv.last().is_some_and(|c| c == "echo work") {
            trip.trip("SIGINT received");
        }
        Answer::Exit(0, String::new())
    });
    let err = ws.run_with(&rt, None, Some(stop)).await.unwrap_err();
    assert_eq!(
        belay_record::Classify::exit_class(&err),
        belay_record::ExitClass::Interrupted,
        "{err}"
    );
    assert!(err.to_string().contains("--resume"), "{err}");
    assert_eq!(rt.commands(), ["echo work"]);
    let id = ws.run_id();
    let up = FakeRuntime::new(|_| Answer::Exit(0, String::new()));
    let out = ws.run(&up, Some(id.clone())).await.unwrap();
    assert_eq!(out.status, Status::Succeeded);
    assert_eq!(up.commands(), ["echo gate"]);
    insta::assert_json_snapshot!("pipeline_stop_and_resume_kinds", ws.kinds(&id));
}
