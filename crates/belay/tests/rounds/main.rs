//! `belay rounds`: the round supervisor, end to end. Real git, the real
//! Docker engine (rounds run in containers unless a test says host), real
//! processes and signals; the agents are scripted programs in the peer's
//! `command` form, and one test runs the real codex CLI against the scripted
//! model server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../shared/pipeline.rs"]
#[allow(dead_code)]
mod common;
#[path = "../shared/events.rs"]
#[allow(dead_code)]
mod events;
#[path = "../shared/git.rs"]
#[allow(dead_code)]
mod git_cli;
#[path = "../shared/output.rs"]
#[allow(dead_code)]
mod output;
#[path = "../shared/replay.rs"]
#[allow(dead_code)]
mod replay;
#[path = "../shared/rounds.rs"]
#[allow(dead_code)]
mod rounds_config;

mod attacks;
mod monitor;
mod units;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use git_cli::{git, init_repo};
use output::{ok, show};
use rounds_config::{config_head, prompt_text, wait_for};
use serde_json::Value;

/// The test agent: the prompt on stdin, its mode in the first argument. A
/// marker number in the second names its processes for `pgrep`.
const AGENT: &str = r#"#!/bin/sh
mode=$1
mark=${2:-0}
cat > "$AGENT_RUNNER_LOG_DIR/../prompt-$AGENT_RUNNER_ROUND_NUM.txt" 2>/dev/null || cat > /dev/null
echo "round $AGENT_RUNNER_ROUND_NUM phase ${AGENT_RUNNER_PHASE:-none} mode $mode"
case "$mode" in
  commit) echo "r$AGENT_RUNNER_ROUND_NUM" >> log.txt; git add log.txt; git -c user.name=a -c user.email=a@a commit -qm "round $AGENT_RUNNER_ROUND_NUM" ;;
  dirty) echo "work of $AGENT_RUNNER_ROUND_NUM" > "work-$AGENT_RUNNER_ROUND_NUM.txt" ;;
  dirty-fail) echo "half done" > half.txt; echo "it broke" >&2; exit 3 ;;
  same) echo "the same" > same.txt ;;
  overrun) (setsid sh -c "exec sleep 77$mark" > /dev/null 2>&1 &); exec sleep 76$mark ;;
  bg) sleep 75$mark & echo "left a sleep behind" ;;
  slow) sleep 2; echo "slept" ;;
  claude-idle) echo '{"type":"result","subtype":"success","is_error":false,"result":"nothing to do","num_turns":0,"usage":{"input_tokens":0,"output_tokens":0}}' ;;
  hang) echo "work" > hang.txt; exec sleep 74$mark ;;
  auth) echo "Error: 401 Unauthorized: invalid x-api-key"; exit 1 ;;
  ratelimit) echo "429 Too Many Requests: rate limit reached, try again in 1 seconds"; exit 1 ;;
  ratelimit-once)
    if [ ! -e "$AGENT_RUNNER_LOG_DIR/limited" ]; then touch "$AGENT_RUNNER_LOG_DIR/limited"
      echo "429 Too Many Requests: rate limit reached, try again in 1 seconds"; exit 1; fi ;;
  done) echo "all finished" > .agent-done ;;
  result-hang) echo '{"type":"result","subtype":"success"}'; exec sleep 73$mark ;;
esac
exit 0
"#;

struct Proj {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    agent: PathBuf,
    /// Names this test's agent processes for `pgrep` (tests run side by side).
    mark: u32,
}

static NEXT_MARK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

fn proj() -> Proj {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(repo.join("prompts")).unwrap();
    std::fs::write(repo.join("README"), "demo\n").unwrap();
    std::fs::write(repo.join("prompts/main.md"), prompt_text()).unwrap();
    init_repo(&repo);
    let agent = tmp.path().join("agent.sh");
    common::install_script(&agent, AGENT);
    let mark = (std::process::id() % 10_000) * 100
        + NEXT_MARK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Proj {
        tmp,
        repo,
        agent,
        mark,
    }
}

impl Proj {
    fn state(&self) -> PathBuf {
        self.tmp.path().join("state")
    }

    fn logs(&self, name: &str) -> PathBuf {
        self.tmp.path().join(format!("logs-{name}"))
    }

    /// A config `name` running the test agent in `mode`, with `extra` TOML
    /// lines appended to the tables they name.
    fn config(
        &self,
        name: &str,
        mode: &str,
        placement: &str,
        runtime: &str,
        extra: &str,
    ) -> PathBuf {
        let agent = self.agent.display().to_string();
        let mark = self.mark.to_string();
        let head = config_head(
            &[agent.as_str(), mode, mark.as_str()],
            placement,
            &self.repo,
            &self.logs(name),
        );
        let text = format!(
            r#"{head}restart_delay_s = 0.2
{runtime}

[prompt]
file = "./prompts/main.md"
{extra}
"#
        );
        // The monitor inside serve watches the machine's real disk: a test
        // that does not test it must not stop because the CI disk is full.
        let text = if extra.contains("host_health.disk") {
            text
        } else {
            format!("{text}\n[monitor.host_health.disk]\nwarning_pct = 100\ncritical_pct = 100\n")
        };
        let p = self.tmp.path().join(format!("{name}.toml"));
        std::fs::write(&p, text).unwrap();
        p
    }

    fn cmd(&self, config: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
        c.env("BELAY_STATE_HOME", self.state())
            .env("HOME", self.tmp.path())
            .env_remove("OPENAI_API_KEY")
            .arg("rounds")
            .arg("--config")
            .arg(config);
        c
    }

    fn run(&self, config: &Path, args: &[&str]) -> Output {
        self.cmd(config).args(args).output().unwrap()
    }

    fn events(&self, name: &str) -> Vec<Value> {
        events::read(&[self.logs(name)])
    }

    fn kinds(&self, name: &str, kind: &str) -> Vec<Value> {
        events::of_kind(self.events(name), kind)
    }

    /// This project's run in `belay runs list --json`.
    fn registry_entry(&self) -> Value {
        let o = Command::new(env!("CARGO_BIN_EXE_belay"))
            .env("BELAY_STATE_HOME", self.state())
            .args(["runs", "list", "--json"])
            .output()
            .unwrap();
        ok(&o);
        let runs: Vec<Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let rounds: Vec<&Value> = runs.iter().filter(|r| r["mode"] == "rounds").collect();
        assert_eq!(rounds.len(), 1, "{runs:?}");
        rounds[0].clone()
    }

    fn json(&self, name: &str, file: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.logs(name).join(file)).unwrap()).unwrap()
    }

    fn stash_shas(&self) -> Vec<String> {
        git(&self.repo, &["stash", "list", "--format=%H"])
            .lines()
            .map(String::from)
            .collect()
    }
}

/// The engine, and the image round agents run in (the base plus git).
fn require_agent_image() {
    common::require_engine();
    let ok = Command::new("docker")
        .args(["image", "inspect", "belay-agent:bookworm"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "these tests need belay-agent:bookworm (./scripts/setup-host.sh --tests builds it)"
    );
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Processes whose command line holds `pattern`.
fn pgrep(pattern: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-af", pattern])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(String::from)
        .collect()
}

#[test]
fn two_rounds_rotate_phases_carry_context_and_record_everything() {
    require_agent_image();
    let p = proj();
    let c = p.config(
        "two",
        "commit",
        "container",
        "round_budget_s = 60",
        "[phases]\nlist = [\"diverge\", \"converge\"]",
    );
    ok(&p.run(&c, &["round"]));
    let o = p.run(&c, &["round", "--json"]);
    ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["round_num"], 2);
    assert_eq!(r["phase"], "converge");
    assert_eq!(r["outcome"], "clean");
    assert_eq!(r["new_commits"], true);
    // The agent committed from inside its container: .git was writable.
    assert_eq!(
        git(&p.repo, &["log", "--format=%s", "-2"]),
        "round 2\nround 1"
    );
    let ctx = p.json("two", "round-context.json");
    assert_eq!(ctx["round_num"], 2);
    assert_eq!(ctx["phase"], "converge");
    assert_eq!(ctx["previous"]["round_num"], 1);
    assert_eq!(ctx["previous"]["exit_code"], 0);
    assert_eq!(ctx["previous"]["outcome"], "clean");
    assert_eq!(ctx["previous"]["had_dirty_tree"], false);
    let status = p.json("two", "status.json");
    assert_eq!(status["round_num"], 2);
    assert_eq!(status["running"], false);
    assert_eq!(status["current_phase"], "converge");
    assert_eq!(status["phase_index"], 1);
    assert_eq!(status["last_outcome"], "clean");
    let kinds: Vec<String> = p
        .events("two")
        .iter()
        .filter(|e| e["source"] == "rounds")
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    insta::assert_json_snapshot!("two_rounds_event_kinds", kinds);
    // Every event is in the shared envelope, and each round has its log.
    for e in p.events("two") {
        assert_eq!(e["v"], 1);
        assert_eq!(e["mode"], "rounds");
    }
    let logs: Vec<String> = std::fs::read_dir(p.logs("two").join("rounds"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(logs.len(), 2, "{logs:?}");
    assert!(logs.iter().any(|l| l.starts_with("R1-")) && logs.iter().any(|l| l.starts_with("R2-")));
    let r2 = logs.iter().find(|l| l.starts_with("R2-")).unwrap();
    let text = std::fs::read_to_string(p.logs("two").join("rounds").join(r2)).unwrap();
    assert!(
        text.contains("round 2 phase converge mode commit"),
        "{text}"
    );
    // `status` agrees, and the run is in `belay runs`.
    let s = p.run(&c, &["status", "--json"]);
    ok(&s);
    let s: Value = serde_json::from_slice(&s.stdout).unwrap();
    assert_eq!(s["state"], "idle");
    let runs = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", p.state())
        .args(["runs", "list", "--mode", "rounds", "--json"])
        .output()
        .unwrap();
    ok(&runs);
    assert!(
        String::from_utf8_lossy(&runs.stdout).contains("rounds-repo-"),
        "{}",
        show(&runs)
    );
}

#[test]
fn a_dirty_tree_is_stashed_by_sha_after_clean_and_failed_exits() {
    require_agent_image();
    let p = proj();
    let c = p.config("dirty", "dirty", "container", "round_budget_s = 60", "");
    ok(&p.run(&c, &["round"]));
    let first = p.stash_shas();
    assert_eq!(first.len(), 1);
    // The prompt file, the supervisor's own input, was not stashed with the work.
    assert!(p.repo.join("prompts/main.md").exists());
    assert!(!p.repo.join("work-1.txt").exists());
    // A failed round's work is stashed too, and the next round is told.
    let f = p.config(
        "dirty",
        "dirty-fail",
        "container",
        "round_budget_s = 60",
        "",
    );
    let o = p.run(&f, &["round"]);
    assert_eq!(code(&o), 1, "{}", show(&o));
    let shas = p.stash_shas();
    assert_eq!(shas.len(), 2);
    assert_eq!(
        shas[1], first[0],
        "the first stash is still named by its SHA"
    );
    let failed_sha = shas[0].clone();
    assert!(git(
        &p.repo,
        &[
            "stash",
            "show",
            "--include-untracked",
            "--name-only",
            &failed_sha
        ]
    )
    .contains("half.txt"));
    let s = p.config(
        "dirty",
        "same",
        "container",
        "round_budget_s = 60",
        "[vcs]\nstash_idempotency_s = 600",
    );
    ok(&p.run(&s, &["round"]));
    let ctx = p.json("dirty", "round-context.json");
    assert_eq!(ctx["round_num"], 3);
    assert_eq!(ctx["previous"]["outcome"], "failed");
    assert_eq!(ctx["previous"]["exit_code"], 3);
    assert_eq!(ctx["previous"]["had_dirty_tree"], true);
    assert_eq!(ctx["orphan_stash"]["ref"], failed_sha.as_str());
    assert_eq!(ctx["orphan_stash"]["round_num"], 2);
    assert_eq!(ctx["orphan_stash"]["outcome"], "failed");
    let all: Vec<&str> = ctx["orphan_stashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ref"].as_str().unwrap())
        .collect();
    assert_eq!(
        all,
        [first[0].as_str(), failed_sha.as_str()],
        "every outstanding stash is listed"
    );
    // Inside the idempotency window: the same changes again are not stashed
    // twice (and stay in the tree); new changes are stashed all the same.
    ok(&p.run(&s, &["round"]));
    assert_eq!(p.kinds("dirty", "orphan_idempotent_skip").len(), 1);
    assert!(
        p.repo.join("same.txt").exists(),
        "skipped changes stay in the tree"
    );
    let d = p.config(
        "dirty",
        "dirty",
        "container",
        "round_budget_s = 60",
        "[vcs]\nstash_idempotency_s = 600",
    );
    std::fs::remove_file(p.repo.join("same.txt")).unwrap();
    ok(&p.run(&d, &["round"]));
    let after = p.stash_shas();
    assert_eq!(after.len(), 4, "the new file was stashed inside the window");
    assert!(git(
        &p.repo,
        &[
            "stash",
            "show",
            "--include-untracked",
            "--name-only",
            &after[0]
        ]
    )
    .contains("work-5.txt"));
    let stashed: Vec<Value> = p.kinds("dirty", "orphan_stashed");
    assert_eq!(stashed.len(), 4);
    assert_eq!(stashed[1]["data"]["reason"], "failed_exit_with_dirty_tree");
}

#[test]
fn the_budget_kills_a_double_forked_grandchild_in_a_container_and_on_the_host() {
    require_agent_image();
    let p = proj();
    let mark = p.mark;
    for placement in ["container", "host"] {
        let c = p.config(placement, "overrun", placement, "round_budget_s = 2", "");
        let t0 = Instant::now();
        let o = p.run(&c, &["round", "--json"]);
        assert_eq!(code(&o), 1, "{}", show(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["outcome"], "timed_out");
        assert!(
            t0.elapsed() < Duration::from_secs(12),
            "{placement}: {:?}",
            t0.elapsed()
        );
        assert!(
            pgrep(&format!("sleep 76{mark}")).is_empty(),
            "{placement}: the agent survived"
        );
        assert!(
            pgrep(&format!("sleep 77{mark}")).is_empty(),
            "{placement}: the double-forked grandchild survived: {:?}",
            pgrep(&format!("sleep 77{mark}"))
        );
        assert_eq!(p.kinds(placement, "round_timeout_kill").len(), 1);
    }
    assert!(
        !p.kinds("host", "leftovers_killed").is_empty(),
        "the host round names what it killed"
    );
}

#[test]
fn a_clean_exit_that_leaves_a_background_sleep_leaves_nothing_behind() {
    require_agent_image();
    let p = proj();
    let mark = p.mark;
    for placement in ["container", "host"] {
        let c = p.config(placement, "bg", placement, "round_budget_s = 60", "");
        let t0 = Instant::now();
        let o = p.run(&c, &["round", "--json"]);
        ok(&o);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["outcome"], "clean", "{placement}");
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "{placement}: the round waited for the leftover: {:?}",
            t0.elapsed()
        );
        assert!(
            pgrep(&format!("sleep 75{mark}")).is_empty(),
            "{placement}: the background sleep survived"
        );
    }
}

/// Start `round` in the background and wait until the agent runs.
fn start_hanging_round(p: &Proj, c: &Path, mark: u32) -> std::process::Child {
    let child = p
        .cmd(c)
        .arg("round")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the agent to start", Duration::from_secs(20), || {
        !pgrep(&format!("sleep 74{mark}")).is_empty()
    });
    child
}

#[test]
fn kill_9_of_belay_takes_the_agent_with_it_and_the_next_round_records_it() {
    require_agent_image();
    let p = proj();
    let mark = p.mark;
    for placement in ["container", "host"] {
        let c = p.config(placement, "hang", placement, "round_budget_s = 120", "");
        let mut child = start_hanging_round(&p, &c, mark);
        let t0 = Instant::now();
        child.kill().unwrap();
        child.wait().unwrap();
        wait_for(
            "the agent to die with belay",
            Duration::from_secs(2),
            || pgrep(&format!("sleep 74{mark}")).is_empty(),
        );
        eprintln!(
            "{placement}: the agent was gone {:?} after kill -9",
            t0.elapsed()
        );
        let s = p.run(&c, &["status", "--json"]);
        let s: Value = serde_json::from_slice(&s.stdout).unwrap();
        assert_eq!(s["state"], "interrupted");
        // The next round records the interrupted one and is told.
        let d = p.config(placement, "commit", placement, "round_budget_s = 60", "");
        ok(&p.run(&d, &["round"]));
        let int = p.kinds(placement, "round_interrupted");
        assert_eq!(int.len(), 1);
        assert_eq!(int[0]["data"]["round_num"], 1);
        let ctx = p.json(placement, "round-context.json");
        assert_eq!(ctx["round_num"], 2);
        assert_eq!(ctx["previous"]["outcome"], "interrupted");
        assert_eq!(
            ctx["previous"]["had_dirty_tree"], true,
            "the interrupted round's tree was stashed"
        );
        assert_eq!(ctx["orphan_stash"]["outcome"], "interrupted");
        let ends: Vec<String> = p
            .kinds(placement, "round_end")
            .iter()
            .map(|e| e["data"]["outcome"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ends, ["interrupted", "clean"]);
    }
}

#[test]
fn one_agent_per_repository_even_with_two_configs() {
    require_agent_image();
    let p = proj();
    let mark = p.mark;
    let a = p.config("a", "hang", "host", "round_budget_s = 120", "");
    let b = p.config("b", "commit", "host", "round_budget_s = 60", "");
    let mut child = start_hanging_round(&p, &a, mark);
    let o = p.run(&b, &["round"]);
    assert_eq!(code(&o), 76, "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("another belay is writing the repository"),
        "{err}"
    );
    assert!(
        err.contains("a.toml"),
        "it names the holder's config: {err}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // Once the holder is gone, the other config runs.
    ok(&p.run(&b, &["round"]));
}

#[test]
fn sigterm_finishes_the_round_then_serve_exits_0_and_a_second_stops_now() {
    require_agent_image();
    let p = proj();
    let c = p.config("term", "slow", "container", "round_budget_s = 60", "");
    let mut serve = p
        .cmd(&c)
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("round 1 to start", Duration::from_secs(20), || {
        !p.kinds("term", "agent_spawn").is_empty()
    });
    let pid = rustix::process::Pid::from_raw(serve.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let st = serve.wait().unwrap();
    assert_eq!(st.code(), Some(0));
    let ends = p.kinds("term", "round_end");
    assert_eq!(ends.len(), 1, "the round finished, and no other started");
    assert_eq!(ends[0]["data"]["outcome"], "clean");
    let stopped = p.kinds("term", "serve_stopped");
    assert!(stopped[0]["data"]["reason"]
        .as_str()
        .unwrap()
        .contains("SIGTERM"));
    assert_eq!(p.json("term", "status.json")["running"], false);
    // A serve stopped as asked is `ok` in the one history, not interrupted.
    let reg = p.registry_entry();
    assert_eq!(reg["status"], "ok", "{reg}");
    assert!(
        reg["summary"].as_str().unwrap().contains("SIGTERM"),
        "{reg}"
    );
    // Two SIGTERMs: the round is killed now and recorded as killed.
    let h = p.config("term", "hang", "container", "round_budget_s = 60", "");
    let mark = p.mark;
    let mut serve = p
        .cmd(&h)
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the agent to start", Duration::from_secs(20), || {
        !pgrep(&format!("sleep 74{mark}")).is_empty()
    });
    let pid = rustix::process::Pid::from_raw(serve.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let st = serve.wait().unwrap();
    assert_eq!(st.code(), Some(130));
    let ends = p.kinds("term", "round_end");
    assert_eq!(ends.last().unwrap()["data"]["outcome"], "killed");
    assert!(pgrep(&format!("sleep 74{mark}")).is_empty());
    // Stopped now: `interrupted`.
    assert_eq!(p.registry_entry()["status"], "interrupted");
}

#[test]
fn serve_stops_at_max_rounds_and_at_the_agents_done_file() {
    require_agent_image();
    let p = proj();
    let c = p.config("max", "commit", "host", "round_budget_s = 60", "");
    let o = p.run(&c, &["serve", "--max-rounds", "3"]);
    ok(&o);
    assert_eq!(p.kinds("max", "round_end").len(), 3);
    assert_eq!(p.kinds("max", "max_rounds_reached").len(), 1);
    // The round context was prepended to the prompt the agent read.
    let prompt = std::fs::read_to_string(p.tmp.path().join("prompt-3.txt")).unwrap();
    assert!(prompt.starts_with("```round-context\n{"), "{prompt}");
    assert!(
        prompt.contains("\"round_num\": 3") && prompt.contains("Work on the project"),
        "{prompt}"
    );
    let d = p.config("max", "done", "host", "round_budget_s = 60", "");
    let o = p.run(&d, &["serve"]);
    ok(&o);
    let done = p.kinds("max", "agent_done");
    assert_eq!(done[0]["data"]["reason"], "all finished");
    assert!(!p.repo.join(".agent-done").exists());
}

#[test]
fn the_peers_generated_config_loads_unchanged_and_bad_keys_name_their_line() {
    let p = proj();
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/rounds/fixtures");
    for f in ["peer-claude.toml", "peer-aider.toml"] {
        let dest = p.repo.join("agent-runner.toml");
        std::fs::copy(fixtures.join(f), &dest).unwrap();
        std::fs::copy(
            fixtures.join("peer-prompt.md"),
            p.repo.join("prompts/main.md"),
        )
        .unwrap();
        let o = p.run(&dest, &["status", "--json"]);
        ok(&o);
        let s: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(s["project"], "repo");
        // The peer's `~/.agent-runner/<project>/logs`, under this HOME.
        let log_dir = s["log_dir"].as_str().unwrap();
        assert!(
            log_dir.starts_with(&p.tmp.path().join(".agent-runner").display().to_string())
                && log_dir.ends_with("/logs"),
            "{s}"
        );
        let d = p.run(&dest, &["doctor", "--json"]);
        let d: Value = serde_json::from_slice(&d.stdout).unwrap();
        let names: Vec<&str> = d["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"prompt_smoke_passes") && names.contains(&"agent_cli_in_path"),
            "{d}"
        );
        assert!(
            d["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "prompt_smoke_passes")
                .unwrap()["ok"]
                == true
        );
    }
    let bad = |text: &str| -> String {
        let f = p.tmp.path().join("bad.toml");
        std::fs::write(&f, text).unwrap();
        let o = p.run(&f, &["status"]);
        assert_eq!(code(&o), 78, "{}", show(&o));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let base = format!("schema_version = 1\n[agent]\ncommand = [\"x\"]\nprompt_arg_template = [\"{{prompt}}\"]\n[runtime]\nwork_dir = \"{}\"\nlog_dir = \"/tmp/l\"\n", p.repo.display());
    let e = bad(&format!(
        "{base}round_budgit_s = 5\n[prompt]\nfile = \"p.md\"\n"
    ));
    assert!(
        e.contains("bad.toml:8:1") && e.contains("round_budgit_s"),
        "{e}"
    );
    let e = bad(&format!(
        "{base}[prompt]\nfile = \"p.md\"\n[goal]\nledger = \"x\"\n"
    ));
    assert!(
        e.contains("bad.toml:10:1") && e.contains("[goal] is not supported"),
        "{e}"
    );
    let e = bad(&base.replace("schema_version = 1\n", ""));
    assert!(e.contains("schema_version"), "{e}");
    let e = bad(&format!(
        "{base}[prompt]\nfile = \"p.md\"\n[vcs]\ndirty_action = \"shelve\"\n"
    ));
    assert!(
        e.contains("bad.toml:11:16") && e.contains("use stash, ignore or auto_commit"),
        "{e}"
    );
    // The seed's names are aliases.
    let f = p.tmp.path().join("seed.toml");
    std::fs::write(&f, format!("{}round_timeout_s = 7\n[prompt]\nfile = \"./prompts/main.md\"\n[vcs]\norphan_action = \"stash\"\n", base.replace("/tmp/l", &p.logs("seed").display().to_string()))).unwrap();
    ok(&p.run(&f, &["status"]));
}

#[test]
fn init_writes_a_config_belay_and_the_doctor_accept() {
    let p = proj();
    let o = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", p.state())
        .env("HOME", p.tmp.path())
        .current_dir(&p.repo)
        .args(["rounds", "init", "--preset", "script"])
        .output()
        .unwrap();
    ok(&o);
    assert_eq!(
        git(&p.repo, &["log", "-1", "--format=%s"]),
        "belay rounds init --preset script"
    );
    assert!(std::fs::read_to_string(p.repo.join(".gitignore"))
        .unwrap()
        .contains("logs/"));
    let again = Command::new(env!("CARGO_BIN_EXE_belay"))
        .current_dir(&p.repo)
        .args(["rounds", "init"])
        .output()
        .unwrap();
    assert_eq!(code(&again), 78);
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    let d = p.run(&p.repo.join("agent-runner.toml"), &["doctor"]);
    let out = String::from_utf8_lossy(&d.stdout);
    // The scaffold's agent script is the user's to write: the doctor says so.
    assert_eq!(code(&d), 78, "{}", show(&d));
    assert!(out.contains("FAIL  agent_cli_in_path"), "{out}");
    assert!(out.contains("ok    prompt_smoke_passes"), "{out}");
}

#[test]
fn the_real_codex_cli_runs_a_round_and_its_usage_is_recorded() {
    require_agent_image();
    let p = proj();
    let script = r#"
turns:
  - name: edit
    match: {api: responses, contains: "round-context"}
    reply:
      tool_calls:
        - name: exec_command
          arguments: {cmd: "echo 'by codex' > codex.txt && git add codex.txt && git -c user.name=c -c user.email=c@c commit -qm 'codex round' && echo edit-done"}
  - name: done
    match: {api: responses, contains: "edit-done"}
    reply: {text: "Committed codex.txt."}
"#;
    let server = replay::Replay::start(p.tmp.path(), script);
    let f = p.tmp.path().join("codex.toml");
    std::fs::write(
        &f,
        format!(
            "schema_version = 1\n[agent]\nagent = \"codex@gpt-5-codex\"\nmodel_url = \"{}\"\nmodel_key_env = \"OPENAI_API_KEY\"\nauto_approve = true\n[runtime]\nwork_dir = \"{}\"\nlog_dir = \"{}\"\nround_budget_s = 120\n[prompt]\nfile = \"./prompts/main.md\"\n",
            server.openai_base(),
            p.repo.display(),
            p.logs("codex").display()
        ),
    )
    .unwrap();
    let o = p
        .cmd(&f)
        .env("OPENAI_API_KEY", "sk-test-rounds-codex-0000000000")
        .args(["round", "--json"])
        .output()
        .unwrap();
    ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["outcome"], "clean");
    assert_eq!(git(&p.repo, &["log", "-1", "--format=%s"]), "codex round");
    let usage = p.kinds("codex", "agent_usage_recorded");
    assert_eq!(usage.len(), 1);
    assert!(
        usage[0]["data"]["input_tokens"].as_u64().unwrap() > 0,
        "{usage:?}"
    );
    assert!(
        usage[0]["data"]["turns"].as_u64().unwrap() >= 1,
        "{usage:?}"
    );
    let used: Vec<String> = server
        .requests()
        .iter()
        .filter_map(|r| r["turn_name"].as_str().map(String::from))
        .collect();
    assert_eq!(used, ["edit", "done"]);
    // The one history has the round's tokens and its end.
    let reg = p.registry_entry();
    assert_eq!(reg["status"], "ok", "{reg}");
    let tokens = usage[0]["data"]["input_tokens"].as_u64().unwrap()
        + usage[0]["data"]["output_tokens"].as_u64().unwrap();
    assert_eq!(reg["tokens"].as_u64(), Some(tokens), "{reg}");
    // The key is scrubbed from every file belay wrote.
    assert!(
        replay::files_containing(&p.logs("codex"), "sk-test-rounds-codex-0000000000").is_empty()
    );
}

/// The bundled example runs as its script says: three rounds, two phases;
/// round 2's uncommitted work is stashed by SHA and round 3 applies it.
#[test]
fn the_bundled_example_runs_three_rounds() {
    require_agent_image();
    let tmp = tempfile::tempdir().unwrap();
    // The example's monitor watches its disk: on a filesystem of its own
    // (where the test may mount one), a full CI disk does not stop it.
    let fs = rustix::process::getuid()
        .is_root()
        .then(|| monitor::Tmpfs::mount(&tmp.path().join("fs"), 256));
    let tmpdir = if fs.is_some() {
        tmp.path().join("fs")
    } else {
        tmp.path().to_path_buf()
    };
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/rounds-demo/run.sh");
    let o = Command::new(&script)
        .env("BELAY", env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", tmp.path().join("state"))
        .env("TMPDIR", &tmpdir)
        .output()
        .unwrap();
    ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let config = out
        .lines()
        .find_map(|l| l.strip_prefix("config: "))
        .unwrap();
    let work = Path::new(config).parent().unwrap();
    assert_eq!(
        git(&work.join("repo"), &["log", "--format=%s"]),
        "round 3: draft\nround 1: draft\nnotes: start"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("repo/NOTES.md")).unwrap(),
        "- note 1: reviewed\n- note 3: drafted\n"
    );
    assert_eq!(
        git(&work.join("repo"), &["stash", "list"]),
        "",
        "round 3 applied and dropped the stash"
    );
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(work.join("logs/orphan-state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        state["stashes"],
        serde_json::json!([]),
        "nothing is outstanding"
    );
    assert!(out.contains("state     idle"), "{out}");
}

/// A fake `claude` printing its stream-json: the adapter reads the usage,
/// turns and cost; the round's turn limit stops the agent, and the day's
/// limit, once spent, keeps the next round from starting (76).
const FAKE_CLAUDE: &str = r#"#!/bin/sh
cat > /dev/null
n=${TOOL_CALLS:-1}
i=1
while [ $i -le $n ]; do
  printf '{"type":"assistant","message":{"id":"m%s","content":[{"type":"tool_use","id":"t%s","name":"Bash","input":{"command":"ls %s"}}],"usage":{"input_tokens":100,"output_tokens":10}}}\n' $i $i $i
  i=$((i+1))
  sleep 0.1
done
printf '{"type":"result","subtype":"success","result":"done","num_turns":%s,"total_cost_usd":0.25,"usage":{"input_tokens":300,"output_tokens":30}}\n' $n
"#;

#[test]
fn usage_comes_from_the_adapter_stream_and_the_limits_hold() {
    require_agent_image();
    let p = proj();
    let bin = p.tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    common::install_script(&bin.join("claude"), FAKE_CLAUDE);
    let cfg = |name: &str, calls: u32, limits: &str| -> PathBuf {
        let f = p.tmp.path().join(format!("{name}.toml"));
        std::fs::write(
            &f,
            format!(
                "schema_version = 1\n[agent]\ncommand = [\"{}\", \"--verbose\", \"--output-format\", \"stream-json\"]\nprompt_arg_template = [\"-p\"]\nprompt_delivery = \"stdin\"\nplacement = \"host\"\nenv = {{ TOOL_CALLS = \"{calls}\" }}\n[runtime]\nwork_dir = \"{}\"\nlog_dir = \"{}\"\nround_budget_s = 60\n[prompt]\nfile = \"./prompts/main.md\"\n[limits]\n{limits}\n",
                bin.join("claude").display(),
                p.repo.display(),
                p.logs("usage").display()
            ),
        )
        .unwrap();
        f
    };
    let c = cfg("ok", 3, "day_turns = 5");
    let o = p.run(&c, &["round", "--json"]);
    ok(&o);
    let u = p.kinds("usage", "agent_usage_recorded");
    assert_eq!(u.len(), 1);
    assert_eq!(u[0]["data"]["turns"], 3);
    assert!(
        u[0]["data"]["input_tokens"].as_u64().unwrap() >= 300,
        "{u:?}"
    );
    assert_eq!(u[0]["data"]["cost_usd"], 0.25);
    let day = p.json("usage", "usage-day.json");
    assert_eq!(day["turns"], 3);
    // A round over its own turn limit is stopped.
    let l = cfg("limit", 6, "round_turns = 2\nday_turns = 5");
    let o = p.run(&l, &["round", "--json"]);
    assert_eq!(code(&o), 1, "{}", show(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["outcome"], "limit");
    assert_eq!(p.kinds("usage", "limit_reached").len(), 1);
    // The day's turns (3 + 3) are spent: the next round does not start.
    let o = p.run(&c, &["round"]);
    assert_eq!(code(&o), 76, "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("day's turn limit"),
        "{}",
        show(&o)
    );
}

/// A rate limit with a reset time: serve pauses until it (plus a little
/// jitter), then goes on; the next clean round records the recovery.
#[test]
fn a_rate_limit_pauses_serve_until_the_reset_time() {
    require_agent_image();
    let p = proj();
    let r = p.config("rate", "ratelimit", "host", "round_budget_s = 60", "");
    ok(&p.run(&r, &["serve", "--max-rounds", "1"]));
    let t: Vec<Value> = p.kinds("rate", "transient_error_detected");
    assert_eq!(t.len(), 1);
    assert!(t[0]["data"]["reset_at"].is_string(), "{t:?}");
    // One round that hits the limit, then a clean one: the pause between
    // them is at least the 1 s the CLI asked for.
    let once = p.config("rate", "ratelimit-once", "host", "round_budget_s = 60", "");
    ok(&p.run(&once, &["serve", "--max-rounds", "2"]));
    assert!(!p.kinds("rate", "transient_error_backoff").is_empty());
    let starts = p.kinds("rate", "round_start");
    let ends = p.kinds("rate", "round_end");
    let at = |e: &Value| {
        e["at"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .unwrap()
    };
    // The reset is "in 1 seconds" from when the line was read (the
    // detection event); the next round starts no earlier.
    let detected = p.kinds("rate", "transient_error_detected");
    let reset = detected.last().unwrap()["data"]["reset_at"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap();
    let next = at(starts.last().unwrap());
    assert!(
        next >= reset,
        "resumed at {next}, before the reset at {reset}"
    );
    assert_eq!(ends.last().unwrap()["data"]["outcome"], "clean");
    assert_eq!(p.kinds("rate", "transient_error_recovered").len(), 1);
}

#[test]
fn the_breakers_stop_a_crash_loop_and_rounds_without_progress_with_75() {
    require_agent_image();
    let p = proj();
    let f = p.config(
        "crash",
        "dirty-fail",
        "host",
        "round_budget_s = 60",
        "[vcs]\ndirty_action = \"ignore\"",
    );
    let o = p.run(&f, &["serve"]);
    assert_eq!(code(&o), 75, "{}", show(&o));
    assert_eq!(p.kinds("crash", "round_end").len(), 5);
    let cl = p.kinds("crash", "crash_loop");
    assert!(cl.last().unwrap()["data"]["tripped"] == true);
    // The delay doubled between the failing rounds.
    let delays: Vec<f64> = cl
        .iter()
        .filter(|e| e["data"]["tripped"] == false)
        .map(|e| e["data"]["delay_s"].as_f64().unwrap())
        .collect();
    assert_eq!(delays, [0.4, 0.8, 1.6, 3.2]);
    // No progress is judged only for an agent that reports usage (the
    // peer's rule): the same silent rounds of a plain script go on.
    let p = proj();
    let n = p.config("noop", "noop", "host", "round_budget_s = 60", "");
    let o = p.run(&n, &["serve", "--max-rounds", "6"]);
    ok(&o);
    assert!(p.kinds("noop", "stalled_no_progress").is_empty());
    assert_eq!(p.kinds("noop", "round_end").len(), 6);
    // A Claude Code stream (a `claude … stream-json` command) that reports
    // no usage for five short clean rounds trips it.
    let p = proj();
    let claude = p.tmp.path().join("claude");
    std::os::unix::fs::symlink(&p.agent, &claude).unwrap();
    let n = p.config("noop", "claude-idle", "host", "round_budget_s = 60", "");
    let text = std::fs::read_to_string(&n).unwrap();
    let old = format!(
        "command = [\"{}\", \"claude-idle\", \"{}\"]",
        p.agent.display(),
        p.mark
    );
    assert!(text.contains(&old), "{text}");
    let text = text.replace(
        &old,
        &format!(
            "command = [\"{}\", \"claude-idle\", \"{}\", \"--output-format\", \"stream-json\"]",
            claude.display(),
            p.mark
        ),
    );
    std::fs::write(&n, text).unwrap();
    // Bounded: a breaker that does not trip ends at max_rounds, not never.
    let o = p.run(&n, &["serve", "--max-rounds", "8"]);
    assert_eq!(code(&o), 75, "{}", show(&o));
    assert_eq!(p.kinds("noop", "stalled_no_progress").len(), 1);
    assert_eq!(p.kinds("noop", "round_end").len(), 5);
}

#[test]
fn outside_its_schedule_serve_waits_and_a_sigterm_still_stops_it() {
    require_agent_image();
    let p = proj();
    let c = p.config(
        "sched",
        "commit",
        "host",
        "round_budget_s = 60",
        "[schedule]\ntimezone = \"UTC\"\npause_windows = [\"00:00-24:00\"]\nrun_windows = []",
    );
    let mut serve = p
        .cmd(&c)
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the pause", Duration::from_secs(20), || {
        !p.kinds("sched", "schedule_paused").is_empty()
    });
    assert!(p.kinds("sched", "round_start").is_empty());
    let pid = rustix::process::Pid::from_raw(serve.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert_eq!(serve.wait().unwrap().code(), Some(0));
    // --ignore-schedule runs anyway.
    ok(&p.run(&c, &["serve", "--ignore-schedule", "--max-rounds", "1"]));
    assert_eq!(p.kinds("sched", "round_end").len(), 1);
}

/// The terminal marker: an agent that printed its result and hangs is
/// killed after the grace, and the round counts as done.
#[test]
fn an_agent_that_hangs_after_its_result_is_killed_after_the_grace() {
    require_agent_image();
    let p = proj();
    for placement in ["host", "container"] {
        let c = p.config(
            placement,
            "result-hang",
            placement,
            "round_budget_s = 60",
            "",
        );
        let text = std::fs::read_to_string(&c)
            .unwrap()
            .replace("[runtime]", "sigterm_grace_s = 1\n[runtime]");
        std::fs::write(&c, text).unwrap();
        let t0 = Instant::now();
        let o = p.run(&c, &["round", "--json"]);
        ok(&o);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["outcome"], "grace_killed", "{placement}");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{placement}: {:?}",
            t0.elapsed()
        );
        assert_eq!(p.kinds(placement, "round_grace_kill").len(), 1);
        assert!(
            pgrep(&format!("sleep 73{}", p.mark)).is_empty(),
            "{placement}"
        );
    }
}

/// `belay runs events ID --follow` follows a live serve to its end: it is
/// still following while rounds run, and ends with the serve's last event.
#[test]
fn runs_events_follow_tails_a_live_serve_to_its_end() {
    let p = proj();
    let c = p.config("follow", "slow", "host", "round_budget_s = 60", "");
    let mut serve = p
        .cmd(&c)
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("round 1 to start", Duration::from_secs(20), || {
        !p.kinds("follow", "agent_spawn").is_empty()
    });
    let reg = p.registry_entry();
    assert_eq!(reg["status"], "running", "{reg}");
    let mut follow = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", p.state())
        .args([
            "runs",
            "events",
            reg["run_id"].as_str().unwrap(),
            "--follow",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        follow.try_wait().unwrap().is_none(),
        "--follow ended while the serve runs"
    );
    let pid = rustix::process::Pid::from_raw(serve.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert_eq!(serve.wait().unwrap().code(), Some(0));
    let t = std::time::Instant::now();
    let out = follow.wait_with_output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("round_end"), "{text}");
    assert!(text.contains("serve_stopped"), "{text}");
    assert_eq!(p.registry_entry()["status"], "ok");
}

/// Claude Code and gemini as round agents (the spec form), in their
/// containers, each in its own dialect (no `model_api`), against the one
/// scripted model server: a clean round, their usage recorded, and the
/// registry's end with their tokens.
#[test]
fn claude_and_gemini_run_a_round_in_their_containers() {
    require_agent_image();
    for (spec, key_env, key) in [
        (
            "claude@claude-sonnet-4-5",
            "ANTHROPIC_API_KEY",
            "sk-ant-test-rounds-000000000000",
        ),
        (
            "gemini@gemini-2.5-flash",
            "GEMINI_API_KEY",
            "gk-test-rounds-gemini-0000000000",
        ),
    ] {
        let p = proj();
        let server = replay::Replay::start(
            p.tmp.path(),
            "turns:\n  - name: any\n    reply: {text: \"Nothing to do this round.\"}\n    repeat: true\n",
        );
        let f = p.tmp.path().join("cli.toml");
        std::fs::write(
            &f,
            format!(
                "schema_version = 1\n[agent]\nagent = \"{spec}\"\nmodel_url = \"{}\"\nmodel_key_env = \"{key_env}\"\nauto_approve = true\n[runtime]\nwork_dir = \"{}\"\nlog_dir = \"{}\"\nround_budget_s = 120\n[prompt]\nfile = \"./prompts/main.md\"\n",
                server.url,
                p.repo.display(),
                p.logs("cli").display()
            ),
        )
        .unwrap();
        let o = p
            .cmd(&f)
            .env(key_env, key)
            .args(["round", "--json"])
            .output()
            .unwrap();
        ok(&o);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["outcome"], "clean", "{spec}: {r}");
        let usage = p.kinds("cli", "agent_usage_recorded");
        assert_eq!(usage.len(), 1, "{spec}");
        assert!(!server.requests().is_empty(), "{spec}");
        let reg = p.registry_entry();
        assert_eq!(reg["status"], "ok", "{spec}: {reg}");
        assert!(reg["tokens"].as_u64().unwrap() > 0, "{spec}: {reg}");
        assert!(
            replay::files_containing(&p.logs("cli"), key).is_empty(),
            "{spec}"
        );
    }
}

/// `rounds init --preset claude|codex|gemini` as written, with the model
/// named the peer's way in `[agent.env]` (a loopback address the container
/// cannot reach): doctor passes (the pinned CLI counts as installed), and a
/// round runs in belay's container, its model reached through belay's route.
#[test]
fn the_cli_presets_run_a_round_in_their_containers_as_written() {
    require_agent_image();
    for (preset, url_var, key_var, key) in [
        (
            "claude",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_API_KEY",
            "sk-ant-test-preset-00000000000",
        ),
        (
            "codex",
            "OPENAI_BASE_URL",
            "OPENAI_API_KEY",
            "sk-test-preset-codex-000000000",
        ),
        (
            "gemini",
            "GOOGLE_GEMINI_BASE_URL",
            "GEMINI_API_KEY",
            "gk-test-preset-gemini-00000000",
        ),
    ] {
        let p = proj();
        let server = replay::Replay::start(
            p.tmp.path(),
            // gemini without `-m` first asks a small model to route the
            // prompt, and wants JSON back.
            "turns:\n  - name: route\n    match: {model: gemini-3.5-flash-lite}\n    reply: {text: \"{\\\"complexity_reasoning\\\": \\\"simple\\\", \\\"complexity_score\\\": 1}\"}\n    repeat: true\n  - name: any\n    reply: {text: \"Nothing to do this round.\"}\n    repeat: true\n",
        );
        let o = Command::new(env!("CARGO_BIN_EXE_belay"))
            .env("BELAY_STATE_HOME", p.state())
            .env("HOME", p.tmp.path())
            .current_dir(&p.repo)
            .args(["rounds", "init", "--preset", preset])
            .output()
            .unwrap();
        ok(&o);
        let f = p.repo.join("agent-runner.toml");
        let text = std::fs::read_to_string(&f).unwrap();
        // The peer's way: the model's address and key in [agent.env].
        let env_table = if text.contains("[agent.env]\n") {
            text.replace(
                "[agent.env]\n",
                &format!(
                    "[agent.env]\n{url_var} = \"{}\"\n{key_var} = \"{key}\"\n",
                    server.url
                ),
            )
        } else {
            text.replace(
                "\n[runtime]",
                &format!(
                    "\n[agent.env]\n{url_var} = \"{}\"\n{key_var} = \"{key}\"\n\n[runtime]",
                    server.url
                ),
            )
        };
        std::fs::write(&f, env_table).unwrap();
        git(&p.repo, &["commit", "-qam", "the model"]);
        ok(&p.run(&f, &["trust"]));
        let d = p.run(&f, &["doctor"]);
        assert_eq!(code(&d), 0, "{preset}: {}", show(&d));
        assert!(
            String::from_utf8_lossy(&d.stdout).contains("ok    agent_image_present"),
            "{preset}: {}",
            show(&d)
        );
        let o = p.run(&f, &["round", "--json"]);
        ok(&o);
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["outcome"], "clean", "{preset}: {r}");
        assert!(
            !server.requests().is_empty(),
            "{preset}: no request reached the model"
        );
    }
}

/// doctor checks the agent image of a container placement: a missing one is
/// exit 76 with the fix, before any round.
#[test]
fn doctor_says_when_the_agent_image_is_missing() {
    require_agent_image();
    let p = proj();
    let c = p.config("img", "commit", "container", "round_budget_s = 60", "");
    let text = std::fs::read_to_string(&c).unwrap().replace(
        "placement = \"container\"",
        "placement = \"container\"\nimage = \"belay-no-such-image:gone\"",
    );
    std::fs::write(&c, text).unwrap();
    let d = p.run(&c, &["doctor"]);
    assert_eq!(code(&d), 76, "{}", show(&d));
    let out = String::from_utf8_lossy(&d.stdout);
    assert!(
        out.contains("FAIL  agent_image_present: the agent image belay-no-such-image:gone is not on this Docker engine"),
        "{out}"
    );
    assert!(out.contains("setup-host.sh"), "{out}");
}
