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
