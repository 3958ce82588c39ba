//! `belay runs` and the one event envelope, end to end: real Docker engine,
//! real git, `belay model replay` as the model. Every test has a registry of
//! its own (`BELAY_STATE_HOME`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../shared/pipeline.rs"]
#[allow(dead_code)]
mod common;
#[path = "../shared/git.rs"]
mod git_cli;
#[path = "../shared/replay.rs"]
#[allow(dead_code)]
mod replay;

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use belay_record::Envelope;
use common::copy_dir;
use git_cli::init_repo;
use replay::Replay;
use serde_json::Value;

const DEMO_URL: &str = "http://127.0.0.1:18765/v1";

struct Home {
    tmp: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let ok = Command::new("docker")
            .args(["image", "inspect", "belay-base:bookworm"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(ok, "these tests need a running Docker engine and belay-base:bookworm (.ci/run sets both up)");
        Home {
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn registry(&self) -> PathBuf {
        self.tmp.path().join("registry")
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
        c.env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .env("BELAY_STATE_HOME", self.registry());
        c
    }

    fn belay(&self, args: &[&str]) -> std::process::Output {
        self.cmd().args(args).output().unwrap()
    }

    fn list(&self) -> Vec<Value> {
        let out = self.belay(&["runs", "list", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn status_of(&self, id: &str) -> String {
        self.list()
            .into_iter()
            .find(|r| r["run_id"] == id)
            .map(|r| r["status"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("{id} is not in `belay runs list`"))
    }

    /// A pipeline workspace from the demo repo with `pipeline` as its file.
    fn pipeline_ws(&self, name: &str, script: &str, pipeline: &str) -> (PathBuf, Replay) {
        let dir = self.tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let repo = dir.join("ws");
        let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/pipeline-demo");
        assert!(Command::new("cp")
            .arg("-r")
            .arg(demo.join("repo"))
            .arg(&repo)
            .status()
            .unwrap()
            .success());
        let replay = Replay::start(&dir, script);
        let text = if pipeline.is_empty() {
            std::fs::read_to_string(repo.join("pipeline.yaml")).unwrap()
        } else {
            pipeline.to_string()
        };
        std::fs::write(
            repo.join("pipeline.yaml"),
            text.replace(DEMO_URL, &replay.openai_base()),
        )
        .unwrap();
        init_repo(&repo);
        (repo, replay)
    }
}

fn demo_script() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/pipeline-demo/replay.yaml"),
    )
    .unwrap()
}

fn envelopes(run_dir: &Path) -> Vec<Envelope> {
    std::fs::read_to_string(run_dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Envelope>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn run_dir_of(h: &Home, id: &str) -> PathBuf {
    let r = h.list().into_iter().find(|r| r["run_id"] == id).unwrap();
    PathBuf::from(r["dir"].as_str().unwrap())
}

/// Runs of env build, pipeline and agent run write events of one schema
/// (the envelope parses with unknown fields denied; `seq` counts from 1),
/// every run is in the registry with its mode, and each mode's kinds are
/// snapshotted.
#[test]
fn every_mode_writes_one_envelope_and_registers_its_runs() {
    let h = Home::new();
    // A pipeline (the demo: agents, gates, the commit).
    let (repo, _replay) = h.pipeline_ws("pipe", &demo_script(), "");
    let out = h
        .cmd()
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(h.tmp.path().join("pstate"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An env build (the empty fixture: workspace checkpoint, finalize).
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/empty-repo");
    let env_repo = h.tmp.path().join("empty");
    copy_dir(&fixture, &env_repo);
    let out = h
        .cmd()
        .args(["env", "build", "--no-cache", "--repo"])
        .arg(&env_repo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An agent run (the built-in agent in a container, scripted).
    let replay = Replay::start(h.tmp.path(), "turns:\n  - reply:\n      tool_calls: [{name: terminal, arguments: {command: \"echo hi\"}}]\n  - reply: {text: done}\n");
    let out = h
        .cmd()
        .args([
            "agent",
            "run",
            "--prompt",
            "say hi",
            "--model",
            "replay-model",
            "--llm-api",
            "chat-completions",
            "--openai-base-url",
        ])
        .arg(replay.openai_base())
        .arg("--repo")
        .arg(&env_repo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A plan run (one checkpoint; a scripted agent that marks its status).
    let plan_repo = h.tmp.path().join("planned");
    std::fs::create_dir_all(&plan_repo).unwrap();
    std::fs::write(
        plan_repo.join("plan_checkpoints.json"),
        r#"{"plan_file": "p.md", "branch": "feature/x", "checkpoints": [{"id": "c1", "name": "one", "scope": "write one.txt", "status": "pending", "exit_criteria": ["one.txt exists"], "attempts": 0, "review_notes": ""}]}"#,
    )
    .unwrap();
    init_repo(&plan_repo);
    let agent = h.tmp.path().join("agent.sh");
    common::install_script(&agent, "#!/bin/sh\np=$(cat)\ncase \"$p\" in *'Review ONLY'*) echo 'VERDICT: approved'; exit 0 ;; esac\necho one > one.txt\nsed -i \"s/\\\"status\\\": \\\"[a-z]*\\\"/\\\"status\\\": \\\"built\\\"/\" plan_checkpoints.json\n");
    let spec = format!("cmd:{}", agent.display());
    let out = h
        .cmd()
        .current_dir(&plan_repo)
        .args(["plan", "run", "--developer", &spec, "--reviewer", &spec])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let runs = h.list();
    let modes: BTreeSet<&str> = runs.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(
        modes,
        BTreeSet::from(["agent", "env", "pipeline", "plan"]),
        "{runs:?}"
    );
    let mut kinds = serde_json::Map::new();
    for r in &runs {
        assert_eq!(r["status"], "ok", "{r}");
        let id = r["run_id"].as_str().unwrap();
        let ev = envelopes(Path::new(r["dir"].as_str().unwrap()));
        assert!(!ev.is_empty());
        assert!(
            ev.iter()
                .all(|e| e.v == 1 && e.run_id == id && e.mode.as_str() == r["mode"]),
            "{id}"
        );
        assert_eq!(
            ev.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=ev.len() as u64).collect::<Vec<_>>()
        );
        let set: BTreeSet<String> = ev
            .iter()
            .map(|e| format!("{}:{}", e.source, e.kind))
            .collect();
        kinds.insert(
            r["mode"].as_str().unwrap().to_string(),
            set.into_iter().collect::<Vec<_>>().into(),
        );
    }
    insta::assert_json_snapshot!("event_kinds_by_mode", kinds);
    // `show` names the run's files.
    let pipe = runs.iter().find(|r| r["mode"] == "pipeline").unwrap();
    let out = h.belay(&["runs", "show", pipe["run_id"].as_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("status    ok")
            && text.contains("events.jsonl")
            && text.contains("state.json"),
        "{text}"
    );
    let missing = h.belay(&["runs", "show", "no-such-run"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("belay runs list"));
}

/// `belay runs events ID --follow`, started from another process while a
/// pipeline's agent step runs, prints that agent's turns before the step ends.
#[test]
fn follow_shows_an_agents_turns_while_its_step_runs() {
    let h = Home::new();
    let script = "turns:\n  - reply:\n      tool_calls: [{name: terminal, arguments: {command: \"echo first-turn\"}}]\n  - reply:\n      tool_calls: [{name: terminal, arguments: {command: \"sleep 4; echo second-turn\"}}]\n  - reply:\n      tool_calls: [{name: finish, arguments: {summary: done}}]\n";
    let pipeline = "name: follow\nllm:\n  model: replay-model\n  base_url: http://127.0.0.1:18765/v1\n  api: chat-completions\nagents_dir: agents\ndeps_policy: open\nsteps:\n  - name: dev\n    agent: dev\n";
    let (repo, _replay) = h.pipeline_ws("follow", script, pipeline);
    let mut run = h
        .cmd()
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(h.tmp.path().join("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        if let Some(r) = h.list().into_iter().next() {
            break r["run_id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "the run never registered");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut follow = h
        .cmd()
        .args(["runs", "events", &id, "--follow", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut saw_turn_before_end = false;
    let mut saw_end = false;
    for l in lines {
        let e: Envelope = serde_json::from_str(&l.unwrap()).unwrap();
        if e.kind == "agent" && e.data["event"].to_string().contains("first-turn") && !saw_end {
            saw_turn_before_end = true;
        }
        if e.kind == "step_end" && e.step.as_deref() == Some("dev") {
            saw_end = true;
        }
        if e.kind == "run_end" {
            break;
        }
    }
    assert!(run.wait().unwrap().success());
    let _ = follow.wait();
    assert!(saw_end, "the follower never saw the step end");
    assert!(
        saw_turn_before_end,
        "the agent's turns appeared only after its step ended"
    );
}

/// After a `kill -9` of an env build and of a pipeline, both are
/// `interrupted`; after their resume, both are `ok`.
#[test]
fn killed_runs_are_interrupted_until_resumed() {
    let h = Home::new();
    let pipeline = "name: slow\ndeps_policy: open\nsteps:\n  - name: wait\n    command: \"[ -f done ] || { touch done; sleep 60; }\"\n";
    let (repo, _replay) = h.pipeline_ws("kill", "turns: []\n", pipeline);
    let state = h.tmp.path().join("state");
    let mut run = h
        .cmd()
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        let l = h.list();
        if let Some(r) = l.first() {
            let d = PathBuf::from(r["dir"].as_str().unwrap());
            if std::fs::read_to_string(d.join("events.jsonl"))
                .unwrap_or_default()
                .contains("\"command\"")
                || repo.join("done").exists()
            {
                break r["run_id"].as_str().unwrap().to_string();
            }
        }
        assert!(Instant::now() < deadline, "the step never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(h.status_of(&id), "running");
    run.kill().unwrap();
    run.wait().unwrap();
    assert_eq!(h.status_of(&id), "interrupted");
    let out = h
        .cmd()
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&state)
        .args(["--resume", &id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(h.status_of(&id), "ok");

    // An env build killed mid-build, then rerun with the same run id.
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-python");
    let env_repo = h.tmp.path().join("hello");
    copy_dir(&src, &env_repo);
    let mut build = h
        .cmd()
        .args([
            "env",
            "build",
            "--no-cache",
            "--run-id",
            "killed-build",
            "--repo",
        ])
        .arg(&env_repo)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(r) = h.list().into_iter().find(|r| r["run_id"] == "killed-build") {
            let ev =
                std::fs::read_to_string(Path::new(r["dir"].as_str().unwrap()).join("events.jsonl"))
                    .unwrap_or_default();
            if ev.contains("block_started") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the build never started a block");
        std::thread::sleep(Duration::from_millis(50));
    }
    build.kill().unwrap();
    build.wait().unwrap();
    assert_eq!(h.status_of("killed-build"), "interrupted");
    let out = h
        .cmd()
        .args(["env", "build", "--run-id", "killed-build", "--repo"])
        .arg(&env_repo)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(h.status_of("killed-build"), "ok");
    let ev = envelopes(&run_dir_of(&h, "killed-build"));
    assert!(ev
        .iter()
        .any(|e| e.kind == "run_resumed" || e.kind == "run_started"));
}

/// A run that fails after its start is `failed` with why, as soon as the
/// command returns: it never reads `interrupted` (a resume it cannot have).
/// Here `belay agent run` opens its run, then finds no Docker engine.
#[test]
fn a_run_that_fails_after_its_start_ends_failed() {
    let h = Home::new();
    let repo = h.tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    init_repo(&repo);
    let out = h
        .cmd()
        .env("DOCKER_HOST", "unix:///nonexistent")
        .args([
            "agent",
            "run",
            "--agent",
            "codex@gpt-5-codex",
            "--prompt",
            "hi",
        ])
        .arg("--repo")
        .arg(&repo)
        .args(["--openai-base-url", "http://127.0.0.1:9/v1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let runs = h.list();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "failed", "{runs:?}");
    assert!(
        runs[0]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("ended by an error")),
        "{runs:?}"
    );
}
