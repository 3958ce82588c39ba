//! The Docker-free tier: whole commands of the real binary, with real git and
//! real processes, that need no container engine (agents on the host with
//! `--on-host` or `placement = "host"`, no gate; dry runs; what a missing
//! engine does). Every test here runs with `DOCKER_HOST` pointing at a socket
//! that does not exist, so one that reached for the engine fails.
//!
//! With the engines' unit tests (the fake runtime) it is the fast tier:
//! `cargo test --workspace --lib --bins --test nodocker`.
//!
//! Each mode's event kinds and its terminal output are insta snapshots, with
//! run ids, paths, times and hashes filtered out.
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
#[path = "../shared/plan.rs"]
#[allow(dead_code)]
mod plan_ws;
#[path = "../shared/rounds.rs"]
#[allow(dead_code)]
mod rounds_config;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use git_cli::git;
use output::{ok, text};
use plan_ws::{two_checkpoints, Setup, Ws, COMPLETED};
use serde_json::Value;

/// A socket nobody listens on: a test that needs the engine fails fast.
const NO_ENGINE: &str = "unix:///nonexistent/belay-no-engine.sock";

/// Run ids, paths, durations, hashes and costs, for the snapshots.
fn filters() -> Vec<(&'static str, &'static str)> {
    vec![
        (r"/tmp/[^\s:,'`)]+", "[PATH]"),
        (r"\b[a-z0-9-]+-\d{8}-\d{6}-[0-9a-f]{4,}\b", "[RUN]"),
        (r"\b\d{8}T\d{6}Z?-[0-9a-z-]+\b", "[RUN]"),
        (r"\b[0-9a-f]{7,40}\b", "[HASH]"),
        (r"\d+(\.\d+)? ?(ms|s)\b", "[TIME]"),
        (r"\$\d+\.\d+", "$[COST]"),
    ]
}

/// The test agent's arms after the shared start ([`plan_ws::AGENT_HEAD`]).
const AGENT: &str = r#"  dev) built ;;
  rev-approve) echo "looks good"; echo "VERDICT: approved"; exit 0 ;;
  rev-slow) sleep 987661 ;;
esac
echo "agent $mode done on $id"
"#;

static SETUP: Setup = Setup {
    agent: AGENT,
    readme: "demo\n",
    plan_commit: true,
    branch: "feature/demo",
    no_branch_is_empty: false,
    env_remove: &[],
    run_flags: &["--on-host"],
};

fn plan_ws() -> Ws {
    Ws::without_engine(&SETUP, &two_checkpoints(SETUP.branch, None))
}

fn no_process(marker: &str) -> bool {
    let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

/// Each event as `step kind`, for a snapshot of the sequence.
fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["step"].as_str().unwrap_or("-"),
                e["kind"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// The plan loop with agents on the host and no gate: two checkpoints
/// built, reviewed and committed; its event kinds and its terminal output.
#[test]
fn the_plan_loop_on_the_host_needs_no_engine() {
    let w = plan_ws();
    let o = w
        .cmd()
        .env("DOCKER_HOST", NO_ENGINE)
        .args(["plan", "run", "--on-host", "--developer"])
        .arg(w.spec("dev"))
        .arg("--reviewer")
        .arg(w.spec("rev-approve"))
        .output()
        .unwrap();
    ok(&o);
    assert_eq!(w.subjects(), COMPLETED);
    insta::with_settings!({ filters => filters() }, {
        insta::assert_json_snapshot!("plan_event_kinds", kinds(&w.events()));
        insta::assert_snapshot!("plan_run_stdout", String::from_utf8_lossy(&o.stdout));
        insta::assert_snapshot!("plan_run_stderr", String::from_utf8_lossy(&o.stderr));
    });
    let listed = w
        .cmd()
        .env("DOCKER_HOST", NO_ENGINE)
        .args(["runs", "list"])
        .output()
        .unwrap();
    ok(&listed);
    let listed = text(&listed);
    assert!(listed.contains("plan"), "{listed}");
    assert!(listed.contains("ok"), "{listed}");
}

/// Ctrl-C in the middle of a review on the host: exit 130 at once, the
/// reviewer's process gone, `belay runs` says interrupted, the same command
/// finishes the run.
#[test]
fn ctrl_c_on_the_host_stops_cleanly_and_the_same_command_resumes() {
    let w = plan_ws();
    let mut child = w
        .cmd()
        .env("DOCKER_HOST", NO_ENGINE)
        .args(["plan", "run", "--on-host", "--developer"])
        .arg(w.spec("dev"))
        .arg("--reviewer")
        .arg(w.spec("rev-slow"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while no_process("sleep 987661") {
        assert!(t0.elapsed() < Duration::from_secs(60), "no review started");
        std::thread::sleep(Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let t1 = Instant::now();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(t1.elapsed() < Duration::from_secs(10), "{:?}", t1.elapsed());
    assert!(stderr.contains("error[BELAY-E130]"), "{stderr}");
    assert!(no_process("sleep 987661"), "the reviewer outlived belay");
    let listed = w.cmd().args(["runs", "list", "--json"]).output().unwrap();
    assert!(
        text(&listed).contains("\"status\":\"interrupted\""),
        "{}",
        text(&listed)
    );
    let o = w.run("dev", "rev-approve", &[]);
    ok(&o);
    assert_eq!(w.subjects(), COMPLETED);
    assert_eq!(w.run_dirs().len(), 1, "the same run went on");
}

/// The job queue builder with its agent on the host: a request, a job, a
/// commit pushed by belay (never by the agent); the job's event kinds and
/// the worker's terminal output.
#[test]
fn a_job_on_the_host_needs_no_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, remote) =
        git_cli::site_with_remote(tmp.path(), &[("index.html", "<h1>hello</h1>\n")]);
    let agent = tmp.path().join("agent.sh");
    common::install_script(
        &agent,
        "#!/bin/sh\ncat > /dev/null\necho '<h1>changed</h1>' > index.html\nprintf '===COMMIT-MESSAGE===\\nchange the title\\n===END-COMMIT-MESSAGE===\\n'\n",
    );
    let config = tmp.path().join("jobs.toml");
    std::fs::write(
        &config,
        format!(
            "queue = \"queue\"\nowners = [\"owner@localhost\"]\n[agent]\nspec = \"cmd:{}\"\nplacement = \"host\"\nwall_time_s = 60\n[[repo]]\nname = \"site\"\npath = \"{}\"\n",
            agent.display(),
            repo.file_name().unwrap().to_string_lossy()
        ),
    )
    .unwrap();
    let jobs = |args: &[&str]| -> Output {
        Command::new(env!("CARGO_BIN_EXE_belay"))
            .env("BELAY_STATE_HOME", tmp.path().join("state"))
            .env("DOCKER_HOST", NO_ENGINE)
            .env_remove("OPENAI_API_KEY")
            .args(["jobs", "--config"])
            .arg(&config)
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let sub = jobs(&["submit", "change the title"]);
    ok(&sub);
    let id = text(&sub).split_whitespace().next().unwrap().to_string();
    let work = jobs(&["work", "--once"]);
    ok(&work);
    let log = git(&remote, &["log", "--format=%s", "main"]);
    assert_eq!(log.lines().next(), Some("change the title"), "{log}");
    let run_dir = find_run_dir(&tmp.path().join("queue"), &id);
    let events = events::complete(&run_dir);
    insta::with_settings!({ filters => filters() }, {
        insta::assert_json_snapshot!("job_event_kinds", kinds(&events));
        insta::assert_snapshot!("jobs_work_stderr", filter_job_id(&String::from_utf8_lossy(&work.stderr), &id));
    });
}

/// The run directory of job `id` under the queue.
fn find_run_dir(queue: &Path, id: &str) -> PathBuf {
    let runs = queue.join("runs");
    std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("events.jsonl").is_file() && p.to_string_lossy().contains(id))
        .unwrap_or_else(|| panic!("no run dir for {id} in {}", runs.display()))
}

fn filter_job_id(s: &str, id: &str) -> String {
    s.replace(id, "[JOB]")
}

/// The pipeline's dry run: the plan of the bundled example, on any machine.
#[test]
fn the_pipeline_dry_run_needs_no_engine() {
    let state = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("DOCKER_HOST", NO_ENGINE)
        .env("BELAY_STATE_HOME", state.path())
        .args(["run", "pipeline.yaml", "--dry-run"])
        .current_dir(common::demo().join("repo"))
        .output()
        .unwrap();
    ok(&o);
    insta::with_settings!({ filters => filters() }, {
        insta::assert_snapshot!("pipeline_dry_run", String::from_utf8_lossy(&o.stdout));
    });
}

/// No engine: `env build` says so at once (exit 3,
/// `BELAY-E301`) with the fix, and leaves no run behind.
#[test]
fn without_an_engine_env_build_says_so_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-python");
    let t = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", tmp.path().join("state"))
        .env("DOCKER_HOST", NO_ENGINE)
        .args(["env", "build", "--repo"])
        .arg(&repo)
        .arg("--state-dir")
        .arg(tmp.path().join("s"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("BELAY-E301"), "{err}");
    assert!(
        !tmp.path().join("s").join("runs").exists()
            || std::fs::read_dir(tmp.path().join("s").join("runs"))
                .unwrap()
                .next()
                .is_none()
    );
    insta::with_settings!({ filters => filters() }, {
        insta::assert_snapshot!("env_build_without_engine", err);
    });
}

/// Each role's agent must speak its endpoint's dialect: a Claude Code
/// reviewer on an OpenAI Responses endpoint, or a codex developer on an
/// Anthropic one, is refused before any work (exit 2, the role and the fix
/// named; no branch, no commit, no run), and a role's own flags fix it.
#[test]
fn a_role_whose_agent_cannot_speak_its_endpoint_is_refused_before_any_work() {
    let w = plan_ws();
    let head = git(&w.repo, &["rev-parse", "HEAD"]);
    let refused = |roles: &[&str], role: &str, fix: &str| {
        let o = w
            .cmd()
            .env("DOCKER_HOST", NO_ENGINE)
            .args(["plan", "run", "--on-host"])
            .args(roles)
            .args(["--openai-base-url", "http://127.0.0.1:9/v1"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("the {role} agent")), "{err}");
        assert!(err.contains(fix), "{err}");
        assert!(err.contains("BELAY-E"), "{err}");
        err.into_owned()
    };
    // One dialect given for both roles: the reviewer cannot speak it.
    let err = refused(
        &[
            "--developer",
            "codex@m",
            "--reviewer",
            "claude@m",
            "--llm-api",
            "responses",
        ],
        "reviewer",
        "--reviewer-llm-api anthropic",
    );
    assert!(err.contains("Anthropic Messages API"), "{err}");
    // A role's own dialect that its agent does not speak.
    refused(
        &[
            "--developer",
            "codex@m",
            "--developer-llm-api",
            "anthropic",
            "--reviewer",
            "claude@m",
        ],
        "developer",
        "--developer-llm-api responses",
    );
    // Nothing happened: no branch, no commit, no run.
    assert_eq!(git(&w.repo, &["rev-parse", "HEAD"]), head);
    let branches = git(&w.repo, &["branch", "--list", SETUP.branch]);
    assert!(branches.is_empty(), "{branches}");
    assert!(w.run_dirs().is_empty(), "{:?}", w.run_dirs());
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `belay jobs` in `tmp` with `config`, the engine out of reach.
fn jobs_in(tmp: &Path, config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", tmp.join("state"))
        .env("DOCKER_HOST", NO_ENGINE)
        .env_remove("OPENAI_API_KEY")
        .args(["jobs", "--config"])
        .arg(config)
        .args(args)
        .current_dir(tmp)
        .output()
        .unwrap()
}

/// A job that fails makes `jobs work --once` exit 1 and say which and why;
/// `jobs list` says how many jobs finished, and `--all` lists them with
/// their outcome and when.
#[test]
fn a_failed_job_fails_work_once_and_finished_jobs_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, _remote) =
        git_cli::site_with_remote(tmp.path(), &[("index.html", "<h1>hello</h1>\n")]);
    let good = tmp.path().join("agent.sh");
    common::install_script(
        &good,
        "#!/bin/sh\ncat > /dev/null\necho '<h1>changed</h1>' > index.html\nprintf '===COMMIT-MESSAGE===\\nchange the title\\n===END-COMMIT-MESSAGE===\\n'\n",
    );
    let bad = tmp.path().join("bad.sh");
    common::install_script(
        &bad,
        "#!/bin/sh\ncat > /dev/null\necho 'cannot reach the build server' >&2\nexit 3\n",
    );
    let config = tmp.path().join("jobs.toml");
    std::fs::write(
        &config,
        format!(
            "queue = \"queue\"\nowners = [\"owner@localhost\"]\n[agent]\nspec = \"cmd:{}\"\nplacement = \"host\"\nwall_time_s = 60\n[[repo]]\nname = \"site\"\npath = \"{}\"\n",
            good.display(),
            repo.file_name().unwrap().to_string_lossy()
        ),
    )
    .unwrap();
    let jobs = |args: &[&str]| jobs_in(tmp.path(), &config, args);
    let empty = jobs(&["list"]);
    ok(&empty);
    assert_eq!(stdout(&empty).trim(), "no jobs in the queue");
    // A job that commits: the queue is empty, and says one finished.
    let sub = jobs(&["submit", "change the title"]);
    ok(&sub);
    let first = text(&sub).split_whitespace().next().unwrap().to_string();
    ok(&jobs(&["work", "--once"]));
    let listed = jobs(&["list"]);
    ok(&listed);
    assert_eq!(
        stdout(&listed).trim(),
        "no jobs waiting; 1 finished: `belay jobs list --all`"
    );
    let all = jobs(&["list", "--all"]);
    ok(&all);
    let row = stdout(&all)
        .lines()
        .find(|l| l.starts_with(&first))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{}", stdout(&all)));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..3], ["done", "committed"], "{row}");
    assert!(cells[3].starts_with("20"), "when: {row}");
    // A job whose agent fails: exit 1, the job and why on stderr.
    let sub = jobs(&[
        "submit",
        "--agent",
        &format!("cmd:{}", bad.display()),
        "break it",
    ]);
    ok(&sub);
    let second = text(&sub).split_whitespace().next().unwrap().to_string();
    let work = jobs(&["work", "--once"]);
    assert_eq!(work.status.code(), Some(1), "{}", text(&work));
    let err = String::from_utf8_lossy(&work.stderr);
    assert!(
        err.contains(&format!("[belay] job {second} failed: the agent")),
        "{err}"
    );
    assert!(err.contains("(exit 3)"), "{err}");
    assert!(
        err.contains(&format!("[belay] warning: job {second} failed: ")),
        "{err}"
    );
    assert!(
        err.contains("1 ran, 0 interrupted, 0 recovered, 1 failed"),
        "{err}"
    );
    // The failed job waits in failed/; the committed one is counted.
    let listed = jobs(&["list"]);
    ok(&listed);
    let t = stdout(&listed);
    assert!(
        t.lines()
            .any(|l| l.starts_with(&second) && l.contains("failed")),
        "{t}"
    );
    assert!(t.contains("and 1 finished: `belay jobs list --all`"), "{t}");
    let all = jobs(&["list", "--all", "--json"]);
    ok(&all);
    let rows: Vec<Value> = serde_json::from_slice(&all.stdout).unwrap();
    let states: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            (second.clone(), "failed".into()),
            (first.clone(), "done".into())
        ]
    );
    assert_eq!(rows[1]["outcome"], "committed");
}

/// A round that leaves the tree dirty: its work is stashed by SHA, and the
/// terminal says which round, the SHA, why, and how to get it back.
#[test]
fn a_rounds_stash_says_its_round_its_sha_and_why() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(repo.join("prompts")).unwrap();
    std::fs::write(repo.join("README"), "demo\n").unwrap();
    std::fs::write(repo.join("prompts/main.md"), rounds_config::prompt_text()).unwrap();
    git_cli::init_repo(&repo);
    let agent = tmp.path().join("agent.sh");
    common::install_script(&agent, "#!/bin/sh\ncat > /dev/null\necho work > work.txt\n");
    let agent = agent.display().to_string();
    let config = tmp.path().join("rounds.toml");
    std::fs::write(
        &config,
        format!(
            "{}restart_delay_s = 0.2\n\n[prompt]\nfile = \"./prompts/main.md\"\n",
            rounds_config::config_head(&[agent.as_str()], "host", &repo, &tmp.path().join("logs"))
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", tmp.path().join("state"))
        .env("HOME", tmp.path())
        .env("DOCKER_HOST", NO_ENGINE)
        .env_remove("OPENAI_API_KEY")
        .args(["rounds", "--config"])
        .arg(&config)
        .arg("round")
        .output()
        .unwrap();
    ok(&o);
    let sha = git(&repo, &["stash", "list", "--format=%H"]);
    let sha = sha.trim();
    assert_eq!(sha.len(), 40, "one stash: {sha}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "[belay] round 1: its work (1 file(s)) is stashed as {sha}: the clean round left the tree dirty; `git stash apply {sha}` brings it back"
        )),
        "{err}"
    );
    assert!(err.contains("[belay] round 1: clean (exit 0) in "), "{err}");
    let stashed = events::read(&[tmp.path().join("logs")])
        .into_iter()
        .find(|e| e["kind"] == "orphan_stashed")
        .unwrap();
    assert_eq!(stashed["data"]["round_num"], 1);
    assert_eq!(stashed["data"]["ref"], sha);
    assert_eq!(stashed["data"]["reason"], "clean_exit_with_dirty_tree");
}
