//! What a user switching from agentic-dev-loop meets first: its dogfood
//! shape, a read-only CLI reviewer, build output kept out of the commit, an
//! exhausted run resumed with more attempts, an engine failure under an
//! agent, and Ctrl-C.

use super::*;

fn peer_dogfood() -> Ws {
    require_engine();
    let tmp = tempfile::tempdir().unwrap();
    let src = demo().join("../peer-compat/dogfood");
    let repo = tmp.path().join("ws");
    copy_dir(&src.join("repo"), &repo);
    let replay = Replay::start(
        tmp.path(),
        &std::fs::read_to_string(src.join("replay.yaml")).unwrap(),
    );
    let p = repo.join("agentic-dev-loop/pipeline.yaml");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace(DEMO_URL, &replay.openai_base());
    std::fs::write(&p, text).unwrap();
    init_repo(&repo);
    let state = tmp.path().join("state");
    Ws {
        _tmp: tmp,
        repo,
        state,
        replay,
    }
}

/// The peer's dogfood shape (dev, test, review, qa, commit) in its own keys:
/// the provider-prefixed model, a read-only `cmd:` reviewer writing its
/// verdict, qa read-only too, the dev's final answer as its summary, and a
/// commit with neither the artifacts nor the test step's build output and
/// `.venv-sandbox`.
#[test]
fn the_peer_dogfood_shape_runs_and_commits_no_paperwork_or_build_output() {
    let ws = peer_dogfood();
    let base = git(&ws.repo, &["rev-parse", "HEAD"]);
    let out = belay()
        .arg("run")
        .arg(ws.repo.join("agentic-dev-loop/pipeline.yaml"))
        .arg("--state-dir")
        .arg(&ws.state)
        .timeout(Duration::from_secs(300))
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    // The console: a line per step start and end, and per route.
    for l in [
        "dev: start (agent, attempt 1)",
        "test: pass in",
        "review: pass in",
        "review: pass -> qa",
        "qa: pass -> commit",
        "commit: committed",
    ] {
        assert!(stderr.contains(l), "no `{l}` in the console:\n{stderr}");
    }
    assert_eq!(git(&ws.repo, &["rev-parse", "HEAD~1"]), base);
    assert_eq!(
        git(&ws.repo, &["diff", "--name-only", "HEAD~1", "HEAD"]),
        "calc.sh",
        "the commit holds the fix only"
    );
    // The test step's build output and the sandbox venv stay in the
    // worktree, uncommitted; no artifact is in the worktree at all.
    assert!(ws.repo.join("build/test-report.txt").is_file());
    assert!(ws.repo.join(".venv-sandbox/bin/marker").is_file());
    for a in [
        "review-findings.md",
        "qa-report.md",
        "implementation-summary.md",
    ] {
        assert!(!ws.repo.join(a).exists(), "{a} is in the worktree");
    }
    let art = ws.run_dir().join("artifacts");
    let review = std::fs::read_to_string(art.join("review-findings.md")).unwrap();
    assert!(review.contains("VERDICT: APPROVED"), "{review}");
    let qa = std::fs::read_to_string(art.join("qa-report.md")).unwrap();
    assert!(qa.contains("VERDICT: PASS"), "{qa}");
    let summary = std::fs::read_to_string(art.join("implementation-summary.md")).unwrap();
    assert!(summary.contains("`add` now adds"), "{summary}");
    let kinds: Vec<String> = ws
        .events()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.contains(&"summary_captured".to_string()), "{kinds:?}");
    // The prefix chose Chat Completions and was not sent.
    let reqs = ws.replay.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert_eq!(r["body"]["model"], "replay-model", "{}", r["body"]);
    }
    // The reviewer's container had the workspace read-only.
    let ro = ws
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "sandbox" && e["data"]["workspace"] == "ro")
        .count();
    assert!(ro >= 1, "no read-only step container");
}

/// A run that used all its attempts continues with `--resume ID
/// --max-attempts 5`: the retry route it could not take, with its feedback,
/// up to the commit. The events record the new budget.
#[test]
fn an_exhausted_run_resumes_with_more_attempts_and_commits() {
    let ws = workspace(&demo_script(), |t| {
        t.replace("max_attempts: 3", "max_attempts: 1")
    });
    let base = git(&ws.repo, &["rev-parse", "HEAD"]);
    ws.run(&[])
        .code(1)
        .stdout(predicates::str::contains("all 1 attempts used"))
        .stdout(predicates::str::contains("--max-attempts N"));
    let st = ws.state();
    assert_eq!(st["status"], "failed");
    assert_eq!(st["exhausted"]["next"], "dev");
    let id = st["run_id"].as_str().unwrap().to_string();
    ws.run(&["--resume", &id])
        .code(2)
        .stderr(predicates::str::contains("--max-attempts N"));
    ws.run(&["--resume", &id, "--max-attempts", "1"])
        .code(2)
        .stderr(predicates::str::contains("gives it none more"));
    ws.run(&["--resume", &id, "--max-attempts", "5"])
        .success()
        .stdout(predicates::str::contains("succeeded"));
    let st = ws.state();
    assert_eq!(st["status"], "succeeded");
    assert_eq!(st["attempt"], 2);
    assert_eq!(st["max_attempts"], 5);
    assert_eq!(git(&ws.repo, &["rev-parse", "HEAD~1"]), base);
    let resumed: Vec<Value> = ws
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "run_resumed")
        .collect();
    assert_eq!(resumed.len(), 1);
    assert_eq!(
        resumed[0]["data"]["budget"],
        serde_json::json!({"max_attempts_before": 1, "max_attempts": 5})
    );
    assert_eq!(resumed[0]["data"]["current"], "dev");
    // The feedback of the failing gate reached the next attempt.
    assert!(ws
        .replay
        .requests()
        .iter()
        .any(|r| r["body"].to_string().contains("FAIL: add 2 3 gave -1")));
}

fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_exit(child: &mut std::process::Child, secs: u64) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (st.code().unwrap_or(-1), err);
        }
        assert!(
            Instant::now() < deadline,
            "belay did not exit within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The step container is removed under a running agent command: the agent
/// stops at once (no further model call), and the run ends with exit 3 and
/// BELAY-E302 within 10 s, not after iterating on error strings.
#[test]
fn an_engine_failure_under_an_agent_ends_the_run_with_exit_3_at_once() {
    let script = r#"
turns:
  - name: dev-sleep
    match: {contains: "You are the developer"}
    reply:
      tool_calls: [{name: terminal, arguments: {command: "sleep 20"}}]
  - name: dev-again
    reply:
      tool_calls: [{name: terminal, arguments: {command: "echo again"}}]
    repeat: true
"#;
    let ws = workspace(script, |t| t);
    let mut child = ws.spawn();
    wait_for("the agent's first command", 120, || {
        !ws.replay.requests().is_empty()
            && ws.state.join("runs").exists()
            && ws.run_dir().join("state.json").exists()
    });
    let id = ws.state()["run_id"].as_str().unwrap().to_string();
    wait_for("the step container", 30, || {
        !common::containers_of(&id).is_empty()
    });
    std::thread::sleep(Duration::from_millis(1500));
    let calls_before = ws.replay.requests().len();
    let killed = Instant::now();
    for c in common::containers_of(&id) {
        Command::new("docker")
            .args(["rm", "-f", &c])
            .output()
            .unwrap();
    }
    let (code, stderr) = wait_exit(&mut child, 30);
    let took = killed.elapsed();
    assert_eq!(code, 3, "{stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(stderr.contains("error[BELAY-E302]"), "{stderr}");
    let agent_events: Vec<String> = ws
        .events()
        .iter()
        .filter(|e| e["kind"] == "agent")
        .map(|e| e["data"].to_string().chars().take(300).collect())
        .collect();
    assert_eq!(
        ws.replay.requests().len(),
        calls_before,
        "the agent called the model after the engine failed: {agent_events:#?}"
    );
    let report = ws
        .events()
        .into_iter()
        .find(|e| e["kind"] == "agent_report")
        .expect("an agent report");
    assert!(
        report["data"]["stop"].to_string().contains("infra"),
        "{}",
        report["data"]["stop"]
    );
    eprintln!("engine failure to exit: {} ms", took.as_millis());
}

/// Ctrl-C mid-step: the step is recorded as interrupted, no container is
/// left, the exit code is 130, and `--resume` completes the run.
#[test]
fn ctrl_c_mid_step_removes_the_containers_and_the_resume_completes() {
    let script = r#"
turns:
  - name: dev-fix
    match: {contains: "You are the developer"}
    reply:
      tool_calls: [{name: edit, arguments: {path: calc.sh, old: "add) echo $(( $2 * $3 ))", new: "add) echo $(( $2 + $3 ))"}}]
  - name: dev-finish
    reply:
      tool_calls: [{name: finish, arguments: {summary: "add adds"}}]
  - name: review-write
    match: {contains: "You are the reviewer"}
    reply:
      tool_calls: [{name: write_file, arguments: {path: review-findings.md, content: "VERDICT: APPROVED\n"}}]
  - name: review-finish
    reply:
      tool_calls: [{name: finish, arguments: {summary: "approved"}}]
"#;
    // The test gate is slow on the first run, and not once resumed.
    let ws = workspace(script, |t| {
        t.replace(
            "command: tests/test.sh",
            "command: test -e \"$BELAY_ARTIFACTS/resumed\" || sleep 60; tests/test.sh",
        )
    });
    let mut child = ws.spawn();
    wait_for("the test gate", 120, || {
        ws.state.join("runs").exists()
            && ws.run_dir().join("state.json").exists()
            && ws.state()["current"] == "test"
    });
    std::thread::sleep(Duration::from_millis(1500));
    let id = ws.state()["run_id"].as_str().unwrap().to_string();
    assert!(!common::containers_of(&id).is_empty());
    let t = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let (code, stderr) = wait_exit(&mut child, 60);
    let took = t.elapsed();
    assert_eq!(code, 130, "{stderr}");
    assert!(
        stderr.contains("error[BELAY-E130]") && stderr.contains("--resume"),
        "{stderr}"
    );
    assert!(
        common::containers_of(&id).is_empty(),
        "a container outlived Ctrl-C"
    );
    let st = ws.state();
    assert_eq!(st["status"], "running");
    assert_eq!(st["current"], "test");
    let kinds: Vec<String> = ws
        .events()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(kinds.contains(&"step_interrupted".to_string()), "{kinds:?}");
    eprintln!("Ctrl-C to exit: {} ms", took.as_millis());
    std::fs::write(ws.run_dir().join("artifacts/resumed"), "").unwrap();
    ws.run(&["--resume", &id])
        .success()
        .stdout(predicates::str::contains("succeeded"));
    assert_eq!(
        git(&ws.repo, &["diff", "--name-only", "HEAD~1", "HEAD"]),
        "calc.sh"
    );
}

/// Podman's Docker-compatible socket (`.ci/run` starts it; `podman system
/// service`, rootful).
const PODMAN_SOCKET: &str = "unix:///run/podman/podman.sock";

/// A networked step with the registries preset asks the egress proxy for a
/// host it does not allow; the proxy's own refusal coming back proves the
/// bytes went through the route (on Podman and with `BELAY_NET_RELAY=1`,
/// through the relay container).
const PROBE: &str = r#"name: relay-probe
deps_policy: open
steps:
  - name: probe
    network: true
    egress: {presets: [package-registries]}
    command: |
      perl -MIO::Socket::INET -e '($h,$p)=$ENV{HTTPS_PROXY}=~m{//([^:/]+):(\d+)}; $s=IO::Socket::INET->new(PeerAddr=>$h,PeerPort=>$p,Timeout=>10) or die "connect $h:$p: $!"; print $s "CONNECT denied.example.invalid:443 HTTP/1.1\r\nHost: x\r\n\r\n"; print while <$s>' | tee /dev/stderr | grep -q "denied.example.invalid:443 is not allowed"
"#;

fn probe(ws: &Ws, env: &[(&str, &str)]) -> (bool, String) {
    let out = ws.command(&[], env).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The relay (forced on Docker) carries the egress route: the proxy on the
/// host answers through it, and the relay container and its uplink go with
/// the run.
#[test]
fn the_relay_carries_the_egress_route_on_docker() {
    let ws = workspace("turns: []\n", |_| PROBE.to_string());
    let (ok, text) = probe(&ws, &[("BELAY_NET_RELAY", "1")]);
    assert!(ok, "{text}\n{}", all_logs(&ws.run_dir()));
    let proxy = ws
        .events()
        .into_iter()
        .find(|e| e["kind"] == "egress_proxy")
        .expect("an egress proxy");
    assert!(
        proxy["data"]["proxy"].as_str().unwrap().ends_with(":3128"),
        "the step did not go through the relay: {}",
        proxy["data"]
    );
    let id = ws.state()["run_id"].as_str().unwrap().to_string();
    assert!(
        common::containers_of(&id).is_empty(),
        "the relay outlived the run"
    );
    let nets = Command::new("docker")
        .args(["network", "ls", "--format", "{{.Name}}"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&nets.stdout).contains(&id),
        "a network of the run is left"
    );
}

/// The pipeline demo passes on Podman's Docker-compatible socket (the
/// feedback loop, the commit), and a networked step's egress reaches the
/// proxy through the relay, since Podman's internal networks have no gateway.
#[test]
fn the_pipeline_demo_passes_on_podman() {
    assert!(
        std::path::Path::new(PODMAN_SOCKET.trim_start_matches("unix://")).exists(),
        "this test needs Podman's Docker-compatible socket at {PODMAN_SOCKET} (.ci/run starts it)"
    );
    let ws = workspace(&demo_script(), |t| t);
    let base = git(&ws.repo, &["rev-parse", "HEAD"]);
    ws.command(&[], &[("DOCKER_HOST", PODMAN_SOCKET)])
        .assert()
        .success()
        .stdout(predicates::str::contains("succeeded"));
    assert_eq!(git(&ws.repo, &["rev-parse", "HEAD~1"]), base);
    assert_eq!(
        git(&ws.repo, &["diff", "--name-only", "HEAD~1", "HEAD"]),
        "calc.sh"
    );
    assert_eq!(ws.state()["attempt"], 2, "the feedback loop ran");
    let id = ws.state()["run_id"].as_str().unwrap().to_string();
    let left = Command::new("podman")
        .args(["ps", "-aq", "--filter", &format!("label=belay.run={id}")])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "a container outlived the run on Podman"
    );

    let ws = workspace("turns: []\n", |_| PROBE.to_string());
    let (ok, text) = probe(&ws, &[("DOCKER_HOST", PODMAN_SOCKET)]);
    assert!(ok, "{text}\n{}", all_logs(&ws.run_dir()));
}

/// The peer's safety boundaries: belay itself inside the workspace is
/// refused; `tools/` is tooling that must be clean; the host's `.venv` is
/// hidden from steps; `setup:` runs without the step's secrets.
#[test]
fn the_peers_safety_boundaries_hold() {
    let pipeline = r#"name: boundaries
deps_policy: open
secrets:
  tok: {from: env, key: BELAY_BOUNDARY_TOKEN}
steps:
  - name: look
    secrets: [tok]
    setup: if [ -z "${BELAY_BOUNDARY_TOKEN:-}" ]; then echo setup-without-secret; else echo setup-HAS-secret; fi
    command: |
      [ -n "$BELAY_BOUNDARY_TOKEN" ] && echo command-has-secret
      if [ -e .venv/bin/host-python ]; then echo HOST-VENV-VISIBLE; else echo host-venv-hidden; fi
      touch .venv/planted 2>/dev/null
      cp /bin/sh "$BELAY_ARTIFACTS/rootshell" && chmod 4755 "$BELAY_ARTIFACTS/rootshell"; true
"#;
    let ws = workspace("turns: []\n", |_| pipeline.to_string());
    std::fs::write(ws.repo.join(".gitignore"), ".venv/\n").unwrap();
    std::fs::create_dir_all(ws.repo.join("tools")).unwrap();
    std::fs::write(ws.repo.join("tools/lint.sh"), "echo lint\n").unwrap();
    git(&ws.repo, &["add", "-A"]);
    git(
        &ws.repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@x",
            "commit",
            "-qm",
            "tools",
        ],
    );
    std::fs::create_dir_all(ws.repo.join(".venv/bin")).unwrap();
    std::fs::write(ws.repo.join(".venv/bin/host-python"), "").unwrap();

    // Dirty tooling in tools/ refuses the run, naming it.
    std::fs::write(ws.repo.join("tools/lint.sh"), "echo changed\n").unwrap();
    ws.run(&[])
        .code(2)
        .stderr(predicates::str::contains("tools"))
        .stderr(predicates::str::contains("error[BELAY-E103]"));
    git(&ws.repo, &["checkout", "--", "tools/lint.sh"]);

    ws.command(&[], &[("BELAY_BOUNDARY_TOKEN", "boundary-canary-77")])
        .assert()
        .success();
    let logs = all_logs(&ws.run_dir());
    assert!(logs.contains("setup-without-secret"), "{logs}");
    assert!(logs.contains("command-has-secret"), "{logs}");
    assert!(logs.contains("host-venv-hidden"), "{logs}");
    assert!(
        !ws.repo.join(".venv/planted").exists(),
        "a step wrote into the host's .venv"
    );

    // belay run from inside the workspace (a hard link, as an editable
    // install would be) is refused before anything runs.
    let inside = ws.repo.join(".venv/bin/belay");
    std::fs::hard_link(env!("CARGO_BIN_EXE_belay"), &inside).unwrap();
    let o = Command::new(&inside)
        .arg("run")
        .arg(ws.repo.join("pipeline.yaml"))
        .arg("--state-dir")
        .arg(ws.state.with_extension("inside"))
        .env("BELAY_BOUNDARY_TOKEN", "x")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("is inside the workspace") && err.contains("BELAY-E103"),
        "{err}"
    );
}

/// Untracked build output at the start is named in a warning (the commit
/// point would refuse to mix it in), even with `--quiet`, which silences the
/// console; with the output under `sync_excludes`, there is no warning and the
/// commit lands without it.
#[test]
fn untracked_output_at_start_is_warned_about_unless_sync_excludes_covers_it() {
    let ws = workspace(&demo_script(), |t| t);
    std::fs::write(ws.repo.join("stray.o"), "object code\n").unwrap();
    let out = ws.command(&["--quiet"], &[]).assert().code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains("warning: the worktree has 1 uncommitted or untracked file(s) (stray.o)"),
        "{err}"
    );
    assert!(
        !err.contains("dev: start"),
        "--quiet printed the console: {err}"
    );
    let refused = ws
        .events()
        .into_iter()
        .any(|e| e["kind"] == "untracked_at_start");
    assert!(refused, "no untracked_at_start event");

    let ws = workspace(&demo_script(), |t| {
        t.replace(
            "deps_policy: open",
            "deps_policy: open\nsync_excludes: [\"*.o\"]",
        )
    });
    std::fs::write(ws.repo.join("stray.o"), "object code\n").unwrap();
    let out = ws.run(&[]).success();
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(!err.contains("untracked"), "{err}");
    assert!(err.contains("dev: start"), "no console: {err}");
    assert_eq!(
        git(&ws.repo, &["diff", "--name-only", "HEAD~1", "HEAD"]),
        "calc.sh"
    );
    assert!(ws.repo.join("stray.o").exists());
}
