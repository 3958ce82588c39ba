//! `belay run` end to end: real Docker engine, real git, `belay model replay`
//! as the model. The workspace is a fresh git repository made from
//! `examples/pipeline-demo/repo` for every test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../shared/git.rs"]
mod git_cli;
#[path = "../shared/replay.rs"]
mod replay;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../shared/pipeline.rs"]
#[allow(dead_code)]
mod common;
use common::{all_logs, belay, copy_dir, demo, latest_run, require_engine, DEMO_URL};
use git_cli::{git, init_repo};
use replay::{files_containing, Replay};
use serde_json::Value;

mod parity;

struct Ws {
    _tmp: tempfile::TempDir,
    repo: PathBuf,
    state: PathBuf,
    replay: Replay,
}

/// A workspace from the demo repo, with `edit` applied to pipeline.yaml before
/// the first commit, and the replay server on `script`.
fn workspace(script: &str, edit: impl Fn(String) -> String) -> Ws {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("ws");
    copy_dir(&demo().join("repo"), &repo);
    let replay = Replay::start(tmp.path(), script);
    let p = repo.join("pipeline.yaml");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace(DEMO_URL, &replay.openai_base());
    std::fs::write(&p, edit(text)).unwrap();
    init_repo(&repo);
    let state = tmp.path().join("state");
    Ws {
        _tmp: tmp,
        repo,
        state,
        replay,
    }
}

fn demo_script() -> String {
    std::fs::read_to_string(demo().join("replay.yaml")).unwrap()
}

impl Ws {
    fn run(&self, extra: &[&str]) -> assert_cmd::assert::Assert {
        self.command(extra, &[]).assert()
    }

    /// `belay run` of the workspace's pipeline, with `env` set.
    fn command(&self, extra: &[&str], env: &[(&str, &str)]) -> assert_cmd::Command {
        let mut c = belay();
        c.arg("run")
            .arg(self.repo.join("pipeline.yaml"))
            .arg("--state-dir")
            .arg(&self.state)
            .args(extra)
            .timeout(Duration::from_secs(300));
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// `belay run` as a child process (to signal or kill it).
    fn spawn(&self) -> std::process::Child {
        Command::new(env!("CARGO_BIN_EXE_belay"))
            .arg("run")
            .arg(self.repo.join("pipeline.yaml"))
            .arg("--state-dir")
            .arg(&self.state)
            .env_remove("OPENAI_API_KEY")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn run_dir(&self) -> PathBuf {
        latest_run(&self.state)
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.run_dir().join("events.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.run_dir().join("state.json")).unwrap()).unwrap()
    }
}

/// The first fix fails the test gate; the gate's output reaches the dev agent;
/// the second attempt passes, review approves, and the commit lands with the
/// expected diff and message. Repository hooks do not run at the commit.
#[test]
fn a_full_run_feeds_back_the_failing_gate_and_commits() {
    let ws = workspace(&demo_script(), |t| t);
    let hook = ws.repo.join(".git/hooks/pre-commit");
    std::fs::write(
        &hook,
        "#!/bin/sh\ntouch \"$(git rev-parse --show-toplevel)/../HOOK-RAN\"\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let base = git(&ws.repo, &["rev-parse", "HEAD"]);
    ws.run(&[])
        .success()
        .stdout(predicates::str::contains("succeeded"));

    // The feedback: the second dev request carries the failing test output.
    let reqs = ws.replay.requests();
    let fed: Vec<&Value> = reqs
        .iter()
        .filter(|r| r["body"].to_string().contains("Previous attempt feedback"))
        .collect();
    assert!(!fed.is_empty(), "no request carried the feedback");
    assert!(
        fed[0]["body"]
            .to_string()
            .contains("FAIL: add 2 3 gave -1, expected 5"),
        "{}",
        fed[0]["body"]
    );

    // The commit: one file, the fix, the templated message.
    let head = git(&ws.repo, &["rev-parse", "HEAD"]);
    assert_ne!(head, base);
    assert_eq!(git(&ws.repo, &["rev-parse", "HEAD~1"]), base);
    let run_id = ws.state()["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        git(&ws.repo, &["log", "-1", "--format=%s"]),
        format!("fix: calc add (belay pipeline {run_id})")
    );
    assert_eq!(
        git(&ws.repo, &["diff", "--name-only", "HEAD~1", "HEAD"]),
        "calc.sh"
    );
    let diff = git(&ws.repo, &["diff", "HEAD~1", "HEAD"]);
    assert!(diff.contains("+  add) echo $(( $2 + $3 ))"), "{diff}");
    assert!(
        !ws.repo.join("../HOOK-RAN").exists(),
        "a repository hook ran"
    );
    // The review artifact is the loop's paperwork: in the run's artifacts,
    // not in the worktree, and not in the commit.
    assert!(ws.run_dir().join("artifacts/review-findings.md").exists());
    assert!(!ws.repo.join("review-findings.md").exists());
    assert_eq!(git(&ws.repo, &["status", "--porcelain"]), "");

    let ev = ws.events();
    let kinds: Vec<&str> = ev.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    for k in [
        "run_started",
        "step_start",
        "step_end",
        "route",
        "attempt",
        "agent",
        "command",
        "commit",
        "run_end",
    ] {
        assert!(kinds.contains(&k), "no {k} event: {kinds:?}");
    }
    let routes: Vec<String> = ev
        .iter()
        .filter(|e| e["kind"] == "route")
        .map(|e| {
            format!(
                "{}->{}",
                e["step"].as_str().unwrap_or("?"),
                e["data"]["to"].as_str().unwrap_or("?")
            )
        })
        .collect();
    assert_eq!(
        routes,
        [
            "dev->test",
            "test->dev (retry)",
            "dev->test",
            "test->review",
            "review->commit",
            "commit->success"
        ]
    );
    let st = ws.state();
    assert_eq!(st["status"], "succeeded");
    assert_eq!(st["attempt"], 2);
    assert_eq!(st["commit"], head);
    let summary: Value =
        serde_json::from_slice(&std::fs::read(ws.run_dir().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "succeeded");
}

/// A dev agent that never fixes the code: attempts run out, the run fails,
/// and nothing is committed.
#[test]
fn attempts_exhausted_fail_the_run_and_commit_nothing() {
    let script = r#"
turns:
  - match: {contains: "You are the developer"}
    reply:
      tool_calls: [{name: finish, arguments: {summary: "nothing to do"}}]
    repeat: true
"#;
    let ws = workspace(script, |t| t);
    let base = git(&ws.repo, &["rev-parse", "HEAD"]);
    ws.run(&["--max-attempts", "2"])
        .code(1)
        .stdout(predicates::str::contains("all 2 attempts used"));
    assert_eq!(git(&ws.repo, &["rev-parse", "HEAD"]), base);
    let st = ws.state();
    assert_eq!(st["status"], "failed");
    assert_eq!(st["attempt"], 2);
    assert_eq!(ws.replay.requests().len(), 2, "one dev call per attempt");
}

/// `kill -9` in the middle of the test gate, then `--resume`: the run goes on
/// at that step with its attempt and feedback, and lands the same commit as an
/// uninterrupted run. A second concurrent run is refused by the lock.
#[test]
fn kill_9_then_resume_lands_the_same_commit() {
    let slow = |t: String| {
        t.replace(
            "command: tests/test.sh",
            "command: sleep 3 && tests/test.sh",
        )
    };
    let straight = workspace(&demo_script(), slow);
    straight.run(&[]).success();
    // The workspaces differ only in the replay port inside pipeline.yaml: the
    // commits must make the same change.
    let want = git(&straight.repo, &["diff", "HEAD~1", "HEAD"]);

    let ws = workspace(&demo_script(), slow);
    let mut child = ws.spawn();
    // Wait for the second visit of the test gate (attempt 2, after feedback).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < deadline,
            "the run never reached the second test"
        );
        let ready = ws.state.join("runs").exists() && ws.run_dir().join("state.json").exists();
        if ready {
            let st = ws.state();
            if st["current"] == "test" && st["attempt"] == 2 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(800));
    // The lock refuses a second run meanwhile.
    ws.run(&[])
        .code(2)
        .stderr(predicates::str::contains("in progress"));
    Command::new("kill")
        .args(["-9", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
    let st = ws.state();
    assert_eq!(st["status"], "running");
    assert_eq!(st["current"], "test");
    assert!(st["feedback"]
        .as_str()
        .unwrap()
        .contains("FAIL: add 2 3 gave -1"));
    let run_id = st["run_id"].as_str().unwrap().to_string();

    ws.run(&["--resume", &run_id]).success();
    let st = ws.state();
    assert_eq!(st["status"], "succeeded");
    assert_eq!(st["attempt"], 2, "the attempt count survived");
    assert_eq!(git(&ws.repo, &["diff", "HEAD~1", "HEAD"]), want);
    assert_eq!(
        git(&ws.repo, &["log", "-1", "--format=%s"]),
        format!("fix: calc add (belay pipeline {run_id})")
    );
    let kinds: Vec<String> = ws
        .events()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.contains(&"run_resumed".to_string()));
    // No step container survived the kill.
    assert!(common::containers_of(&run_id).is_empty());
}

/// A secret reaches only the step that lists it, and appears in no file under
/// the state dir, in no log, and not in the commit. A missing ref fails fast.
#[test]
fn secrets_are_refs_injected_per_step_and_scrubbed() {
    const CANARY: &str = "canary-secret-7f3e9a1c5b";
    let edit = |t: String| {
        t.replace("deps_policy: open", "deps_policy: open\nsecrets:\n  api-token: {from: env, key: BELAY_TEST_TOKEN}")
            .replace(
                "  - name: test\n    command: tests/test.sh",
                "  - name: test\n    command: echo \"token=$BELAY_TEST_TOKEN\" && tests/test.sh\n    secrets: [api-token]",
            )
            .replace(
                "  - name: commit\n",
                "  - name: peek\n    command: echo \"peek=${BELAY_TEST_TOKEN:-unset}\"\n    on_pass: commit\n\n  - name: commit\n",
            )
            .replace("on_pass: commit\n    on_fail: { goto: dev, retry: true }", "on_pass: peek\n    on_fail: { goto: dev, retry: true }")
    };
    let ws = workspace(&demo_script(), edit);
    belay()
        .arg("run")
        .arg(ws.repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&ws.state)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("secret `api-token` (used by step `test`) is missing: set the environment variable BELAY_TEST_TOKEN"));
    belay()
        .arg("run")
        .arg(ws.repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&ws.state)
        .env("BELAY_TEST_TOKEN", CANARY)
        .timeout(Duration::from_secs(300))
        .assert()
        .success();
    assert!(
        files_containing(&ws.state, CANARY).is_empty(),
        "{:?}",
        files_containing(&ws.state, CANARY)
    );
    assert!(
        files_containing(&ws.repo, CANARY).is_empty(),
        "{:?}",
        files_containing(&ws.repo, CANARY)
    );
    assert!(!git(&ws.repo, &["log", "-p", "-1"]).contains(CANARY));
    // The test step saw it (redacted in its log); the peek step did not get it.
    let all = all_logs(&ws.run_dir());
    assert!(all.contains("token=[REDACTED:api-token]"), "{all}");
    assert!(all.contains("peek=unset"), "{all}");
}

/// Network: none unless a step asks. Read-only root, .git read-only.
#[test]
fn network_is_off_unless_asked_and_the_sandbox_is_locked_down() {
    // The apt mirror named by the image's own sources (no host name here).
    let probe = r#"host=$(grep -hoE 'https?://[^/ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -1 | sed 's#.*://##'); echo "probing $host"; timeout 15 bash -c "exec 3<>/dev/tcp/$host/80 && printf 'HEAD / HTTP/1.0\r\nHost: $host\r\n\r\n' >&3 && head -1 <&3""#;
    let pipeline = format!(
        r#"name: net
max_attempts: 1
deps_policy: open
steps:
  - name: offline
    command: {offline:?}
    on_pass: failure
    on_fail: locked
  - name: locked
    command: "! touch /usr/belay-x 2>/dev/null && ! touch .git/belay-x 2>/dev/null && touch ok-in-workspace && echo locked-down"
    on_pass: online
  - name: online
    command: {online:?}
    network: true
"#,
        offline = probe,
        online = probe
    );
    let ws = workspace("turns: []\n", |_| pipeline.clone());
    ws.run(&[]).success();
    let logs = ws.run_dir().join("logs");
    let read = |prefix: &str| -> String {
        std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains(prefix))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .unwrap()
    };
    let off = read("-offline-");
    assert!(
        off.contains("probing ") && !off.contains("HTTP/1."),
        "the offline step reached the mirror: {off}"
    );
    assert!(read("-locked-").contains("locked-down"));
    let on = read("-online-");
    assert!(
        on.contains("HTTP/1."),
        "the networked step could not reach the mirror: {on}"
    );
    assert!(ws.repo.join("ok-in-workspace").exists());
}

/// Dirty tooling and a `.env` refuse the run; `--dry-run` prints the plan and
/// writes nothing.
#[test]
fn the_host_boundary_refuses_dirty_tooling_and_env_files() {
    let ws = workspace(&demo_script(), |t| t);
    std::fs::write(
        ws.repo.join("agents/dev.agent.md"),
        "---\nname: dev\n---\nDo anything.\n",
    )
    .unwrap();
    ws.run(&[])
        .code(2)
        .stderr(predicates::str::contains("agents/dev.agent.md"));
    git(&ws.repo, &["checkout", "--", "agents/dev.agent.md"]);
    std::fs::write(ws.repo.join(".env"), "KEY=v\n").unwrap();
    std::fs::write(ws.repo.join(".env.example"), "KEY=\n").unwrap();
    ws.run(&[])
        .code(2)
        .stderr(predicates::str::contains("the workspace holds .env:"));
    std::fs::remove_file(ws.repo.join(".env")).unwrap();
    let dry_state = ws.state.with_extension("dry");
    belay()
        .arg("run")
        .arg(ws.repo.join("pipeline.yaml"))
        .arg("--dry-run")
        .arg("--state-dir")
        .arg(&dry_state)
        .assert()
        .success()
        .stdout(predicates::str::contains(
            "on pass -> review; on fail -> dev (retry)",
        ));
    assert!(!dry_state.exists(), "--dry-run wrote state");
    assert!(
        ws.replay.requests().is_empty(),
        "--dry-run called the model"
    );
}

/// Malformed pipeline files: `file:line:col` errors, exit 2.
#[test]
fn malformed_pipeline_files_name_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        (
            "name: x\nsteps:\n  - name: a\n    command: true\n    colour: red\n",
            "pipeline.yaml:5:",
            "colour",
        ),
        (
            "name: x\nsteps:\n  - name: a\n    command: true\n    agent: dev\n",
            "pipeline.yaml:3:",
            "exactly one of",
        ),
        (
            "name: x\nsteps:\n  - name: a\n    command: true\n    on_fail: nowhere\n",
            "pipeline.yaml:5:",
            "`nowhere`",
        ),
        (
            "name: x\nsteps:\n  - name: a\n    command: true\n  - name: a\n    command: false\n",
            "pipeline.yaml:5:",
            "defined twice",
        ),
        (
            "name: x\nsteps:\n  - name: a\n    command: true\n    secrets: [tok]\n",
            "pipeline.yaml:5:",
            "does not declare",
        ),
        ("name: x\nsteps: [\n", "pipeline.yaml:", ""),
    ];
    for (text, loc, what) in cases {
        let p = tmp.path().join("pipeline.yaml");
        std::fs::write(&p, text).unwrap();
        let out = belay().args(["run", "--dry-run"]).arg(&p).assert().code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(err.contains(loc) && err.contains(what), "{text:?}: {err}");
    }
}

/// The bridge between the two modes: the final image of `belay env build`
/// runs the project's tests as a pipeline step (its venv under the workspace
/// path comes from the image although the workspace is bind-mounted there),
/// and is the pipeline's image by default. Before there is one, a step the
/// default image cannot run is refused before the run starts.
#[test]
fn an_env_build_image_runs_the_pipeline_steps() {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("ws");
    let st = Command::new("cp")
        .arg("-r")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-python"))
        .arg(&repo)
        .status()
        .unwrap();
    assert!(st.success());
    // Before there is an env build, the default image has no python3: the
    // step is refused before the run starts, with the way to one.
    std::fs::write(
        repo.join("pipeline.yaml"),
        "name: bridge\ndeps_policy: open\nsteps:\n  - name: test\n    command: python3 -m pytest -q\n",
    )
    .unwrap();
    init_repo(&repo);
    let early = tmp.path().join("early-state");
    let out = belay()
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&early)
        .timeout(Duration::from_secs(120))
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains(
            "step test: its command `python3 -m pytest -q` runs `python3`, which the image"
        ) && err.contains("belay env build --repo"),
        "{err}"
    );
    assert!(
        !early.join("runs").exists()
            || std::fs::read_dir(early.join("runs"))
                .unwrap()
                .next()
                .is_none(),
        "a refused run left a run"
    );
    std::fs::remove_dir_all(repo.join(".git")).unwrap();
    std::fs::remove_file(repo.join("pipeline.yaml")).unwrap();
    let env_state = tmp.path().join("env-state");
    let run = format!("t-bridge-{}", std::process::id());
    belay()
        .args(["env", "build", "--planner", "rules", "--repo"])
        .arg(&repo)
        .arg("--state-dir")
        .arg(&env_state)
        .args(["--run-id", &run])
        .timeout(Duration::from_secs(900))
        .assert()
        .success();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(env_state.join("runs").join(&run).join("manifest.json")).unwrap(),
    )
    .unwrap();
    let image = manifest["final_image"].as_str().unwrap().to_string();
    // No isolation.image: the repository's latest env build is the image,
    // and `python3` is the project's interpreter (its venv on PATH).
    std::fs::write(
        repo.join("pipeline.yaml"),
        "name: bridge\ndeps_policy: open\nsteps:\n  - name: test\n    command: python3 -m pytest -q\n",
    )
    .unwrap();
    init_repo(&repo);
    let state = tmp.path().join("state");
    let out = belay()
        .arg("run")
        .arg(repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&state)
        .timeout(Duration::from_secs(300))
        .assert()
        .success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains(&format!(
            "sandbox image {image} (the repository's latest env build {run})"
        )),
        "{err}"
    );
    let run_dir = latest_run(&state);
    let all = all_logs(&run_dir);
    assert!(all.contains("passed"), "{all}");
    // The run's environment volume is gone with the run.
    let run_id = run_dir.file_name().unwrap().to_string_lossy().into_owned();
    let vols = Command::new("docker")
        .args([
            "volume",
            "ls",
            "-q",
            "--filter",
            &format!("name=belay-{run_id}"),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&vols.stdout).trim().is_empty());
    // The env build's checkpoints.
    let imgs = Command::new("docker")
        .args([
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            &format!("label=belay.run={run}"),
        ])
        .output()
        .unwrap();
    for tag in String::from_utf8_lossy(&imgs.stdout)
        .lines()
        .filter(|l| !l.contains("<none>"))
    {
        let _ = Command::new("docker").args(["rmi", "-f", tag]).output();
    }
}

/// `egress: {presets: [package-registries]}`: a networked step has no direct
/// route out; through the allowlisting proxy it reaches the package mirror this
/// machine is configured for, and nothing else.
#[test]
fn egress_presets_allow_only_the_package_registries() {
    let probe = r#"host=$(grep -hoE 'https?://[^/ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -1 | sed 's#.*://##'); if timeout 5 bash -c "exec 3<>/dev/tcp/$host/80" 2>/dev/null; then echo direct-open; else echo direct-blocked; fi; p=${HTTP_PROXY#http://}; ph=${p%:*}; pp=${p##*:}; exec 3<>/dev/tcp/$ph/$pp; printf "HEAD http://$host/ HTTP/1.0\r\nHost: $host\r\n\r\n" >&3; echo "via-proxy: $(head -1 <&3)"; exec 4<>/dev/tcp/$ph/$pp; printf "CONNECT elsewhere.example.invalid:443 HTTP/1.1\r\nHost: x\r\n\r\n" >&4; echo "other: $(head -1 <&4)""#;
    let pipeline = format!("name: egress\ndeps_policy: open\negress: {{presets: [package-registries]}}\nsteps:\n  - name: fetch\n    command: {probe:?}\n    network: true\n");
    let ws = workspace("turns: []\n", |_| pipeline.clone());
    ws.run(&["--dry-run"])
        .success()
        .stdout(predicates::str::contains(
            "out only through the egress proxy",
        ));
    ws.run(&[]).success();
    let logs = ws.run_dir().join("logs");
    let log: String = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("-fetch-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(log.contains("direct-blocked"), "{log}");
    assert!(log.contains("via-proxy: HTTP/1."), "{log}");
    assert!(log.contains("other: HTTP/1.1 403"), "{log}");
    let ev = ws.events();
    let decisions: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "egress").collect();
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    assert!(
        decisions
            .iter()
            .any(|d| d["data"]["host"] == "elsewhere.example.invalid"
                && d["data"]["allowed"] == false)
    );
    assert!(decisions.iter().any(|d| d["data"]["allowed"] == true));
    // The internal network went with the run.
    let run_id = ws.state()["run_id"].as_str().unwrap().to_string();
    let nets = Command::new("docker")
        .args([
            "network",
            "ls",
            "-q",
            "--filter",
            &format!("name=belay-{run_id}"),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&nets.stdout).trim().is_empty());
}

/// An agent file with `runner: codex`: the real codex CLI runs inside the
/// step's container (from the read-only agents mount), reaches only the model
/// endpoint, fixes the code; the gates and the commit follow as usual.
#[test]
fn a_codex_agent_runs_inside_the_step_container() {
    let script = r#"
turns:
  - name: codex-fix
    match: {api: responses, contains: "You are the developer"}
    reply:
      tool_calls:
        - name: exec_command
          arguments: {cmd: "sed -i 's/add) echo $(( $2 \\* $3 ))/add) echo $(( $2 + $3 ))/' calc.sh && tests/test.sh && (timeout 3 bash -c 'exec 3<>/dev/tcp/1.1.1.1/80' && echo OUTSIDE-REACHED || echo outside-blocked)"}
  - name: codex-done
    match: {api: responses, contains: "outside-"}
    reply: {text: "Fixed add; the tests pass."}
  - name: review-write
    match: {contains: "You are the reviewer"}
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: review-findings.md, content: "VERDICT: APPROVED\n"}
  - name: review-finish
    match: {contains: "You are the reviewer"}
    reply:
      tool_calls: [{name: finish, arguments: {summary: "ok"}}]
"#;
    let ws = workspace(script, |t| {
        t.replace("api: chat-completions", "api: responses")
    });
    std::fs::write(
        ws.repo.join("agents/dev.agent.md"),
        "---\nname: dev\ntools: [shell]\nrunner: codex\n---\nYou are the developer. Make tests/test.sh pass by fixing calc.sh.\n",
    )
    .unwrap();
    git(&ws.repo, &["commit", "-qam", "dev runs codex"]);
    let out = ws.run(&[]);
    if !out.get_output().status.success() {
        let reports: Vec<Value> = ws
            .events()
            .into_iter()
            .filter(|e| e["kind"] != "agent")
            .collect();
        panic!("the run failed: {reports:#?}");
    }
    assert_eq!(
        git(&ws.repo, &["diff", "--name-only", "HEAD~1", "HEAD"]),
        "calc.sh"
    );
    assert!(git(&ws.repo, &["diff", "HEAD~1", "HEAD"]).contains("+  add) echo $(( $2 + $3 ))"));
    let ev = ws.events();
    let report = ev
        .iter()
        .find(|e| e["kind"] == "agent_report" && e["data"]["runner"] == "codex")
        .expect("a codex report");
    assert_eq!(report["data"]["stop"]["reason"], "completed", "{report}");
    let cmd = ev
        .iter()
        .find(|e| e["kind"] == "agent" && e["data"]["event"]["kind"] == "command")
        .expect("codex's command in the events");
    let out = cmd["data"]["event"]["output"].as_str().unwrap();
    assert!(out.contains("ok: add 2 3 = 5"), "{out}");
    assert!(
        out.contains("outside-blocked") && !out.contains("OUTSIDE-REACHED"),
        "the CLI container reached beyond the model: {out}"
    );
    assert!(ev.iter().any(|e| e["kind"] == "model_route"));
    let codex_requests = ws
        .replay
        .requests()
        .iter()
        .filter(|r| {
            r["turn_name"]
                .as_str()
                .is_some_and(|n| n.starts_with("codex"))
        })
        .count();
    assert_eq!(codex_requests, 2);
}

/// Claude Code and gemini as the dev step's runner, each in the step
/// container against the scripted model server in its own dialect (the
/// pipeline's `llm.api`, which the built-in reviewer speaks too): its shell
/// tool call fixes calc.sh and runs the tests, it cannot reach beyond the
/// model, and the fix is committed.
#[test]
fn claude_and_gemini_agents_run_inside_the_step_container() {
    for (runner, api, tool, key_env) in [
        ("claude", "anthropic", "Bash", "ANTHROPIC_API_KEY"),
        ("gemini", "gemini", "run_shell_command", "GEMINI_API_KEY"),
    ] {
        let script = r#"
turns:
  - name: cli-fix
    match: {api: @API@, contains: "You are the developer"}
    reply:
      tool_calls:
        - name: @TOOL@
          arguments: {command: "sed -i 's/add) echo $(( $2 \\* $3 ))/add) echo $(( $2 + $3 ))/' calc.sh && tests/test.sh && (timeout 3 bash -c 'exec 3<>/dev/tcp/1.1.1.1/80' && echo OUTSIDE-REACHED || echo outside-blocked)"}
  - name: cli-done
    match: {api: @API@, contains: "outside-"}
    reply: {text: "Fixed add; the tests pass."}
  - name: review-write
    match: {contains: "You are the reviewer"}
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: review-findings.md, content: "VERDICT: APPROVED\n"}
  - name: review-finish
    match: {contains: "You are the reviewer"}
    reply:
      tool_calls: [{name: finish, arguments: {summary: "ok"}}]
"#
        .replace("@API@", api)
        .replace("@TOOL@", tool);
        let ws = workspace(&script, |t| {
            t.replace("api: chat-completions", &format!("api: {api}"))
        });
        // These dialects' base URL is the server itself, without `/v1`.
        let p = ws.repo.join("pipeline.yaml");
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace(&ws.replay.openai_base(), &ws.replay.url);
        std::fs::write(&p, text).unwrap();
        std::fs::write(
            ws.repo.join("agents/dev.agent.md"),
            format!("---\nname: dev\ntools: [shell]\nrunner: {runner}\n---\nYou are the developer. Make tests/test.sh pass by fixing calc.sh.\n"),
        )
        .unwrap();
        git(&ws.repo, &["commit", "-qam", &format!("dev runs {runner}")]);
        let key = format!("test-pipeline-{runner}-key-0123456789");
        let t = Instant::now();
        let out = ws.command(&[], &[(key_env, &key)]).assert();
        let took = t.elapsed();
        if !out.get_output().status.success() {
            let reports: Vec<Value> = ws
                .events()
                .into_iter()
                .filter(|e| e["kind"] != "agent")
                .collect();
            panic!("{runner}: the run failed: {reports:#?}");
        }
        assert_eq!(
            git(&ws.repo, &["diff", "--name-only", "HEAD~1", "HEAD"]),
            "calc.sh",
            "{runner}"
        );
        assert!(
            git(&ws.repo, &["diff", "HEAD~1", "HEAD"]).contains("+  add) echo $(( $2 + $3 ))"),
            "{runner}"
        );
        assert!(git(&ws.repo, &["log", "-1", "--format=%s"]).starts_with("fix: calc add"));
        let ev = ws.events();
        let report = ev
            .iter()
            .find(|e| e["kind"] == "agent_report" && e["data"]["runner"] == runner)
            .unwrap_or_else(|| panic!("no {runner} report"));
        assert_eq!(report["data"]["stop"]["reason"], "completed", "{report}");
        assert_eq!(report["data"]["exit_code"], 0, "{report}");
        // The CLI's shell call, with its output, in the events.
        let result = ev
            .iter()
            .filter(|e| e["kind"] == "agent")
            .map(|e| &e["data"]["event"])
            .find(|e| {
                (e["kind"] == "tool_result" || e["kind"] == "command")
                    && e["output"]
                        .as_str()
                        .is_some_and(|o| o.contains("ok: add 2 3 = 5"))
            })
            .unwrap_or_else(|| panic!("{runner}: the tests' output is in no event"));
        let out = result["output"].as_str().unwrap();
        assert!(
            out.contains("outside-blocked") && !out.contains("OUTSIDE-REACHED"),
            "the CLI container reached beyond the model: {out}"
        );
        assert!(ev.iter().any(|e| e["kind"] == "model_route"));
        // Both of the CLI's requests, in its own dialect.
        let reqs = ws.replay.requests();
        let cli: Vec<&Value> = reqs
            .iter()
            .filter(|r| {
                r["turn_name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("cli-"))
            })
            .collect();
        assert_eq!(cli.len(), 2, "{runner}: {reqs:#?}");
        assert!(cli.iter().all(|r| r["api"] == api), "{runner}: {cli:#?}");
        let found = files_containing(&ws.state, &key);
        assert!(found.is_empty(), "{runner}: the key is in {found:?}");
        eprintln!("{runner}: the run took {took:?}");
    }
}

/// `deps_policy: locked`: an agent that declares missing dependencies fails
/// the run at once with the pins to add; a secret that an agent writes into
/// its artifact is scrubbed from it.
#[test]
fn locked_dependencies_fail_fast_and_artifacts_are_scrubbed() {
    let script = r#"
turns:
  - match: {contains: "You may only use dependencies already present in requirements.lock"}
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: notes.md, content: "used token canary-dep-secret-42 to check\n"}
  - reply:
      tool_calls:
        - name: finish
          arguments: {summary: "Partly done.\n\n## Missing dependencies\nrequests==2.32.3\n- rich==13.7.1\n"}
"#;
    let edit = |t: String| {
        t.replace("deps_policy: open", "deps_policy: locked\nlockfiles: [requirements.lock]\nsecrets:\n  tok: {from: env, key: BELAY_DEP_TOKEN}")
            .replace("    max_iterations: 12\n", "    max_iterations: 12\n    produces: notes.md\n    secrets: [tok]\n")
    };
    let ws = workspace(script, edit);
    belay()
        .arg("run")
        .arg(ws.repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&ws.state)
        .env("BELAY_DEP_TOKEN", "canary-dep-secret-42")
        .timeout(Duration::from_secs(300))
        .assert()
        .code(1)
        .stdout(predicates::str::contains(
            "Extend requirements.lock with these pins and re-run: requests==2.32.3, rich==13.7.1",
        ));
    // The declared output was moved out of the worktree into the run's
    // artifacts, scrubbed on the way.
    assert!(!ws.repo.join("notes.md").exists());
    let notes = std::fs::read_to_string(ws.run_dir().join("artifacts/notes.md")).unwrap();
    assert_eq!(notes, "used token [REDACTED:tok] to check\n");
    assert!(files_containing(&ws.state, "canary-dep-secret-42").is_empty());
}

/// `setup:` runs once (network on), then its stamp skips it; `--refresh`
/// runs it again; `--clean-stamps` forgets the stamps.
#[test]
fn setup_is_stamped_refreshed_and_cleaned() {
    let pipeline = "name: setup\ndeps_policy: open\nsteps:\n  - name: test\n    setup: echo provisioned >> .setup-count\n    command: test -f .setup-count\n";
    let ws = workspace("turns: []\n", |_| pipeline.to_string());
    let count = || {
        std::fs::read_to_string(ws.repo.join(".setup-count"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    ws.run(&[]).success();
    assert_eq!(count(), 1);
    std::fs::remove_file(ws.repo.join(".setup-count")).unwrap();
    std::fs::write(ws.repo.join(".setup-count"), "provisioned\n").unwrap();
    ws.run(&[]).success();
    assert_eq!(count(), 1, "the stamp did not skip the setup");
    ws.run(&["--refresh"]).success();
    assert_eq!(count(), 2, "--refresh did not rerun the setup");
    ws.run(&["--clean-stamps"])
        .success()
        .stdout(predicates::str::contains("deleted the provision stamps"));
    ws.run(&[]).success();
    assert_eq!(count(), 3, "the setup did not run after --clean-stamps");
    let kinds: Vec<String> = ws
        .events()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.contains(&"command".to_string()));
}

/// A background job does not outlive its step: the next step (which holds a
/// secret) finds no process of the earlier one.
#[test]
fn background_jobs_end_with_their_step() {
    let pipeline = r#"name: bg
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BG_TOKEN}
steps:
  - name: leave
    command: "nohup sleep 300 >/dev/null 2>&1 & echo started"
  - name: check
    secrets: [tok]
    command: "n=$(for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null; echo; done | grep -c '^sleep 300'); echo left=$n; [ $n = 0 ]"
"#;
    let ws = workspace("turns: []\n", |_| pipeline.to_string());
    belay()
        .arg("run")
        .arg(ws.repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(&ws.state)
        .env("BELAY_BG_TOKEN", "bg-token-value-9")
        .timeout(Duration::from_secs(120))
        .assert()
        .success();
    assert!(all_logs(&ws.run_dir()).contains("left=0"));
}
