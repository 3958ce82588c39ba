//! `belay jobs`: the job queue builder, end to end. Real git (a local bare
//! remote), the real Docker engine (agents and checks in containers), real
//! processes (`belay jobs work` killed with SIGTERM and SIGKILL), a real
//! XMPP server (prosody) and client (tokio-xmpp). The agents are scripted
//! programs (`cmd:`) that edit files the way an agent CLI would; one is a
//! scripted `claude` printing its stream-json, so that the iteration limit
//! counts real tool calls.
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
#[path = "../shared/queue.rs"]
#[allow(dead_code)]
mod job_queue;
#[path = "../shared/output.rs"]
#[allow(dead_code)]
mod output;
#[path = "../shared/replay.rs"]
#[allow(dead_code)]
mod replay;
mod xmpp;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use git_cli::git;
use output::{ok, show, text};
use serde_json::Value;

/// The scripted agent: the prompt on stdin; the request's `@@` lines say
/// what to do, as an agent CLI's tools would.
const AGENT: &str = r#"#!/bin/sh
p=$(cat)
printf '%s\n' "$p" | grep '^@@' > /tmp/.directives.$$ 2>/dev/null || true
while read -r verb rest; do
  case "$verb" in
    @@write) f=${rest%% *}; t=${rest#* }; printf '%s\n' "$t" > "$f" ;;
    @@say) echo "$rest" ;;
    @@commit) printf '===COMMIT-MESSAGE===\n%s\n===END-COMMIT-MESSAGE===\n' "$rest" ;;
    @@sleep) sleep "$rest" ;;
    @@sleep-unless) m=${rest%% *}; s=${rest#* }; if [ ! -e "$m" ]; then : > "$m"; sleep "$s"; fi ;;
    @@append) echo "$BELAY_JOB_ID" >> "$rest" ;;
    @@link) ln -s "${rest#* }" "${rest%% *}" ;;
    @@fail) echo "it broke" >&2; exit 3 ;;
    @@long) i=0; while [ $i -lt "$rest" ]; do echo "line $i of the long answer ........................................................................"; i=$((i+1)); done; echo "the end of the long answer" ;;
    @@ifprompt) pat=${rest%% *}; word=${rest#* }; if printf '%s' "$p" | grep -q "$pat"; then echo "$word"; fi ;;
    @@sneak) if git add -A 2>/dev/null && git commit -qm sneaky 2>/dev/null; then echo SNEAK-COMMITTED; else echo SNEAK-REFUSED; fi
             if touch .git/sneak 2>/dev/null; then echo SNEAK-WROTE-GIT; fi ;;
  esac
done < /tmp/.directives.$$
rm -f /tmp/.directives.$$
"#;

/// A scripted `claude -p --output-format stream-json`: a tool call per
/// step, each with a line of progress, then its result.
const FAKE_CLAUDE: &str = r#"#!/bin/sh
cat > /dev/null
i=1
while [ $i -le 8 ]; do
  printf '{"type":"assistant","message":{"id":"a%s","content":[{"type":"text","text":"progress: step %s done"}]}}\n' $i $i
  printf '{"type":"assistant","message":{"id":"m%s","content":[{"type":"tool_use","id":"t%s","name":"Bash","input":{"command":"ls %s"}}],"usage":{"input_tokens":100,"output_tokens":10}}}\n' $i $i $i
  i=$((i+1))
  sleep 0.2
done
printf '{"type":"result","subtype":"success","result":"all done","num_turns":8,"total_cost_usd":0.01,"usage":{"input_tokens":800,"output_tokens":80}}\n'
"#;

/// A scripted fixer: the first answer by its mode, and the answer to the
/// format correction (whose prompt says so) by the same mode.
const FIXER: &str = r#"#!/bin/sh
mode=$1
p=$(cat)
corr=no
if printf '%s' "$p" | grep -q 'could not be used only because'; then corr=yes; fi
ni='{"schema_version":1,"outcome":"needs_input","summary":"I need the port","commit_hash":null,"pushed_branch":null,"tests":[],"question":"Which port?","required_action":"Say the port","review_required":false,"failure":null}'
rep='{"schema_version":1,"outcome":"repaired","summary":"fixed the title","commit_hash":null,"pushed_branch":null,"tests":[{"command":"make test","result":"passed"}],"question":null,"required_action":null,"review_required":true,"failure":null}'
block() { printf '===FIX_RESULT===\n%s\n===END_FIX_RESULT===\n' "$1"; }
commit() { printf '===COMMIT-MESSAGE===\nfix: the title\n===END-COMMIT-MESSAGE===\n'; }
case "$mode" in
  valid) echo '<h1>fixed</h1>' > index.html; block "$rep"; commit ;;
  extra-then-valid)
    if [ $corr = no ]; then block '{"schema_version":1,"outcome":"needs_input","summary":"s","commit_hash":null,"pushed_branch":null,"tests":[],"question":"q?","required_action":"a","review_required":false,"failure":null,"target_phase":"x"}'
    else block "$ni"; fi ;;
  wrong-type) block '{"schema_version":"1","outcome":"needs_input","summary":"s","commit_hash":null,"pushed_branch":null,"tests":[],"question":"q?","required_action":"a","review_required":false,"failure":null}' ;;
  commit-on-needs-input) echo '<h1>sneaky</h1>' > index.html; block "$ni"; commit ;;
esac
"#;

struct Ws {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    remote: PathBuf,
    agent: PathBuf,
}

fn ws() -> Ws {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, remote) = git_cli::site_with_remote(
        tmp.path(),
        &[
            ("index.html", "<h1>hello</h1>\n"),
            ("README.md", "a site\n"),
        ],
    );
    let agent = tmp.path().join("agent.sh");
    common::install_script(&agent, AGENT);
    Ws {
        tmp,
        repo,
        remote,
        agent,
    }
}

impl Ws {
    fn path(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    fn queue(&self) -> PathBuf {
        self.path("queue")
    }

    /// jobs.toml: the owner, the agent (`placement`), the repository (with
    /// `repo_extra` in its table), and `extra` tables.
    fn config(&self, placement: &str, repo_extra: &str, extra: &str) -> PathBuf {
        let f = self.path("jobs.toml");
        std::fs::write(
            &f,
            format!(
                "queue = \"queue\"\nowners = [\"owner@localhost\"]\n[agent]\nspec = \"cmd:{}\"\nplacement = \"{placement}\"\nwall_time_s = 120\n[commit]\nlock_wait_s = 30\n[[repo]]\nname = \"site\"\npath = \"site\"\n{repo_extra}\n{extra}\n",
                self.agent.display()
            ),
        )
        .unwrap();
        f
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
        c.env("BELAY_STATE_HOME", self.path("state"))
            .env_remove("OPENAI_API_KEY")
            .arg("jobs")
            .arg("--config")
            .arg(self.path("jobs.toml"))
            .current_dir(self.tmp.path());
        c
    }

    fn submit(&self, args: &[&str], body: &str) -> String {
        let o = self
            .cmd()
            .arg("submit")
            .args(args)
            .arg(body)
            .output()
            .unwrap();
        ok(&o);
        text(&o).split_whitespace().next().unwrap().to_string()
    }

    fn work_once(&self, args: &[&str]) -> Output {
        let o = self
            .cmd()
            .args(["work", "--once"])
            .args(args)
            .output()
            .unwrap();
        ok(&o);
        o
    }

    /// `work --once` that runs a job that fails: exit 1, the job named on
    /// stderr with its status.
    fn work_once_failing(&self, id: &str, status: &str) -> Output {
        let o = self.cmd().args(["work", "--once"]).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("warning: job {id} {status}: ")),
            "{err}"
        );
        o
    }

    fn spawn_work(&self, args: &[&str]) -> Child {
        self.cmd()
            .arg("work")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn record(&self, id: &str) -> Value {
        let p = self.queue().join("done").join(format!("{id}.json"));
        serde_json::from_str(
            &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        )
        .unwrap()
    }

    fn remote_log(&self) -> Vec<String> {
        git(&self.remote, &["log", "--format=%s|%an", "main"])
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn events(&self, id: &str) -> Vec<Value> {
        events::complete(&self.queue().join("runs").join(id))
    }

    fn wait_event(&self, id_dir: &str, kind: &str, timeout: Duration) {
        let t = Instant::now();
        while !self.events(id_dir).iter().any(|e| e["kind"] == kind) {
            assert!(t.elapsed() < timeout, "no {kind} event in {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Where each job is: `(dir, id)`.
    fn jobs_in(&self, dir: &str) -> Vec<String> {
        job_queue::jobs_in(&self.queue(), dir)
    }

    /// The job ids of the runs that exist.
    fn outbox(&self) -> Vec<Value> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.queue().join("outbox"))
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
            .iter()
            .filter_map(|p| serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok())
            .collect()
    }
}

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

/// Every file of the tree but `.git`, with its bytes, and git's view of it.
fn snapshot(dir: &Path) -> (Vec<(String, Vec<u8>)>, String) {
    fn walk(root: &Path, d: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel == ".git" {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files);
    files.sort();
    (files, git(dir, &["status", "--porcelain=v1", "-uall"]))
}

/// A job without a commit block commits nothing, though it changed files.
#[test]
fn no_commit_block_commits_nothing() {
    require_agent_image();
    let w = ws();
    w.config("container", "", "");
    let id = w.submit(
        &[],
        "@@write index.html <h1>changed</h1>\n@@say I changed it but forgot the block",
    );
    w.work_once(&[]);
    let r = w.record(&id);
    assert_eq!(r["status"], "no_changes", "{r}");
    assert!(r["commits"].as_array().unwrap().is_empty());
    assert!(
        r["report"].as_str().unwrap().contains("no commit block"),
        "{r}"
    );
    assert_eq!(w.remote_log().len(), 1, "{:?}", w.remote_log());
    // The worktree and its branch are gone; the checkout is untouched.
    assert_eq!(
        std::fs::read_to_string(w.repo.join("index.html")).unwrap(),
        "<h1>hello</h1>\n"
    );
    assert!(!git(&w.repo, &["branch", "--list", "builder-job-*"]).contains("builder-job"));
    assert_eq!(git(&w.repo, &["worktree", "list"]).lines().count(), 1);
    assert!(w.jobs_in("processing").is_empty() && w.jobs_in("inbox").is_empty());
    // The run is in belay's history.
    let o = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", w.path("state"))
        .args(["runs", "list", "--mode", "jobs", "--json"])
        .output()
        .unwrap();
    ok(&o);
    assert!(text(&o).contains(&id), "{}", text(&o));
}

/// The iteration limit stops a scripted claude after its third tool call:
/// the answer is the interim report, nothing is committed, and the report
/// is in the sender's next prompt.
#[test]
fn the_iteration_limit_gives_an_interim_report_carried_into_the_next_job() {
    require_agent_image();
    let w = ws();
    w.config("container", "", "");
    let bin = w.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    common::install_script(&bin.join("claude"), FAKE_CLAUDE);
    let claude = format!(
        "cmd:{} -p --output-format stream-json",
        bin.join("claude").display()
    );
    let id = w.submit(
        &["--agent", &claude, "--iteration-limit", "3"],
        "do a long thing",
    );
    w.work_once_failing(&id, "limit_reached");
    let r = w.record(&id);
    assert_eq!(r["status"], "limit_reached", "{r}");
    let report = r["report"].as_str().unwrap();
    assert!(report.contains("iteration limit (3)"), "{report}");
    assert!(report.contains("progress: step"), "{report}");
    assert!(
        !report.contains("step 5 done"),
        "it ran past the limit: {report}"
    );
    assert!(r["commits"].as_array().unwrap().is_empty());
    assert_eq!(w.remote_log().len(), 1);
    // The next job of the same sender is given the report.
    let next = w.submit(
        &[],
        "@@ifprompt Interim[[:space:]]report[[:space:]]by CARRIED-INTERIM\n@@say ok",
    );
    w.work_once(&[]);
    let r2 = w.record(&next);
    assert!(
        r2["report"].as_str().unwrap().contains("CARRIED-INTERIM"),
        "{r2}"
    );
    // Reset drops it.
    ok(&w.cmd().args(["reset"]).output().unwrap());
    let third = w.submit(
        &[],
        "@@ifprompt Interim[[:space:]]report[[:space:]]by CARRIED-INTERIM\n@@say ok",
    );
    w.work_once(&[]);
    assert!(!w.record(&third)["report"]
        .as_str()
        .unwrap()
        .contains("CARRIED"));
}

/// Uncommitted changes of the main checkout (modified, staged, deleted,
/// untracked, CRLF, binary) are back byte for byte after a job that commits
/// and after one that fails.
#[test]
fn foreign_changes_are_restored_byte_for_byte() {
    require_agent_image();
    let w = ws();
    w.config("container", "", "");
    std::fs::write(w.repo.join("index.html"), "<h1>mine</h1>\r\ntrailing   \n").unwrap();
    std::fs::write(w.repo.join("new.bin"), [0u8, 1, 2, 255, 13, 10]).unwrap();
    std::fs::write(w.repo.join("staged.txt"), "staged\n").unwrap();
    git(&w.repo, &["add", "staged.txt"]);
    std::fs::remove_file(w.repo.join("README.md")).unwrap();
    std::fs::create_dir_all(w.repo.join("notes/deep")).unwrap();
    std::fs::write(w.repo.join("notes/deep/n.md"), "untracked\n").unwrap();
    let before = snapshot(&w.repo);
    let good = w.submit(&[], "@@write page.html built\n@@commit add a page");
    w.work_once(&[]);
    assert_eq!(w.record(&good)["status"], "committed");
    assert_eq!(snapshot(&w.repo).0, before.0, "the files changed");
    let bad = w.submit(&[], "@@write page.html again\n@@fail");
    w.work_once_failing(&bad, "failed");
    assert_eq!(w.record(&bad)["status"], "failed");
    let after = snapshot(&w.repo);
    assert_eq!(after.0, before.0, "the files changed after a failed job");
    assert!(
        after.1.contains("README.md") && after.1.contains("new.bin"),
        "{}",
        after.1
    );
    assert_eq!(git(&w.repo, &["stash", "list"]), "", "a stash was left");
    assert_eq!(w.jobs_in("failed"), vec![bad]);
}

/// FIX_RESULT: a valid block commits; an extra field gets one correction;
/// a wrong type twice, or a commit block on needs_input, end in the
/// deterministic needs_input with nothing committed.
#[test]
fn fix_results_are_validated_and_corrected_once() {
    require_agent_image();
    let w = ws();
    w.config("container", "", "");
    let fixer = w.path("fixer.sh");
    common::install_script(&fixer, FIXER);
    let spec = |m: &str| format!("cmd:{} {m}", fixer.display());
    let valid = w.submit(
        &["--role", "fixer", "--agent", &spec("valid")],
        "the title is wrong",
    );
    let extra = w.submit(
        &["--role", "fixer", "--agent", &spec("extra-then-valid")],
        "repair",
    );
    let wrong = w.submit(
        &["--role", "fixer", "--agent", &spec("wrong-type")],
        "repair",
    );
    let sneaky = w.submit(
        &["--role", "fixer", "--agent", &spec("commit-on-needs-input")],
        "repair",
    );
    w.work_once(&[]);
    let r = w.record(&valid);
    assert_eq!(r["status"], "committed", "{r}");
    let f = &r["fixer_outcome"];
    assert_eq!(f["outcome"], "repaired");
    assert_eq!(f["commit_hash"], r["commits"][0]["hash"], "{r}");
    assert_eq!(f["pushed_branch"], "main");
    let r = w.record(&extra);
    assert_eq!(r["fixer_outcome"]["outcome"], "needs_input", "{r}");
    assert_eq!(
        r["fixer_outcome"]["question"], "Which port?",
        "the correction's answer stands: {r}"
    );
    let kinds: Vec<String> = w
        .events(&extra)
        .iter()
        .filter(|e| e["kind"] == "fix_result_invalid")
        .map(|e| e["data"]["error"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds.len(), 1, "{kinds:?}");
    assert!(kinds[0].contains("target_phase"), "{kinds:?}");
    for id in [&wrong, &sneaky] {
        let r = w.record(id);
        assert_eq!(r["status"], "no_changes", "{r}");
        let f = &r["fixer_outcome"];
        assert_eq!(f["outcome"], "needs_input", "{r}");
        assert_eq!(
            f["required_action"],
            "Check and complete the FIX_RESULT details."
        );
        assert!(
            f["summary"]
                .as_str()
                .unwrap()
                .contains("even after one format correction"),
            "{r}"
        );
        assert_eq!(
            w.events(id)
                .iter()
                .filter(|e| e["kind"] == "fix_result_invalid")
                .count(),
            2
        );
    }
    assert!(w.record(&sneaky)["fixer_outcome"]["summary"]
        .as_str()
        .unwrap()
        .contains("only `repaired`"));
    let log = w.remote_log();
    assert_eq!(log.len(), 2, "only the valid fix is committed: {log:?}");
    assert!(
        log[0].starts_with("fix: the title|belay builder"),
        "{log:?}"
    );
}

/// SIGTERM mid-job: the agent's container goes, the job is back in the
/// inbox, the owner is told, and the checkout is as it was.
#[test]
fn sigterm_mid_job_requeues_it_and_tells_the_owner() {
    require_agent_image();
    let w = ws();
    w.config("container", "", "");
    std::fs::write(w.repo.join("mine.txt"), "foreign\n").unwrap();
    let before = snapshot(&w.repo);
    let id = w.submit(&[], "@@write index.html half\n@@sleep 60\n@@commit never");
    let child = w.spawn_work(&[]);
    w.wait_event(&id, "agent_started", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(700));
    let t = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stop_s = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stop_s < 20.0, "the stop took {stop_s} s");
    assert_eq!(w.jobs_in("inbox"), vec![id.clone()]);
    assert!(w.jobs_in("processing").is_empty());
    // The owner is told (with no chat configured, on belay's log).
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("Job {id} was interrupted by a shutdown")),
        "{err}"
    );
    assert_eq!(snapshot(&w.repo).0, before.0);
    assert_eq!(git(&w.repo, &["worktree", "list"]).lines().count(), 1);
    assert!(
        common::containers_of(&id).is_empty(),
        "a container of the job is left"
    );
    assert_eq!(w.remote_log().len(), 1);
}

/// kill -9 mid-job: the next start undoes the workspace (the foreign
/// changes back), requeues the job once, and runs it.
#[test]
fn kill_9_mid_job_is_requeued_once_at_the_next_start() {
    let w = ws();
    w.config("host", "", "");
    std::fs::write(w.repo.join("mine.txt"), "foreign\n").unwrap();
    let before = snapshot(&w.repo);
    let marker = w.path("slept");
    let id = w.submit(&[], &format!("@@write index.html <h1>after the crash</h1>\n@@sleep-unless {} 60\n@@commit after a crash", marker.display()));
    let mut child = w.spawn_work(&[]);
    w.wait_event(&id, "agent_started", Duration::from_secs(60));
    let t = Instant::now();
    while !marker.exists() {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(w.jobs_in("processing"), vec![id.clone()]);
    assert!(
        !w.repo.join("mine.txt").exists(),
        "the foreign change is stashed while the job runs"
    );
    let o = w.work_once(&[]);
    assert!(text(&o).contains("1 recovered"), "{}", text(&o));
    assert_eq!(
        snapshot(&w.repo).0,
        before.0,
        "the foreign changes are back"
    );
    let r = w.record(&id);
    assert_eq!(r["status"], "committed", "{r}");
    assert_eq!(
        w.events(&id)
            .iter()
            .filter(|e| e["kind"] == "job_started")
            .count(),
        2
    );
    assert!(w.remote_log()[0].starts_with("after a crash|"));
    assert_eq!(git(&w.repo, &["stash", "list"]), "");
}

/// Two worker processes (two workers each) on one queue: 50 jobs, each run
/// exactly once.
#[test]
fn two_workers_run_fifty_jobs_exactly_once() {
    let w = ws();
    w.config("host", "", "");
    let log = w.path("ran.log");
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(w.submit(
            &["--fresh"],
            &format!("@@append {}\n@@say job {i}", log.display()),
        ));
    }
    let a = w.spawn_work(&["--once", "--workers", "2"]);
    let b = w.spawn_work(&["--once", "--workers", "2"]);
    for c in [a, b] {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let ran = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = ran.lines().collect();
    assert_eq!(lines.len(), 50, "{ran}");
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), 50, "a job ran twice");
    let mut want = ids.clone();
    want.sort();
    assert_eq!(lines, want.iter().map(String::as_str).collect::<Vec<_>>());
    for id in &ids {
        assert_eq!(w.record(id)["status"], "no_changes");
    }
    for d in ["inbox", "processing", "failed"] {
        assert!(w.jobs_in(d).is_empty(), "{d}: {:?}", w.jobs_in(d));
    }
}

/// Bad input: a malformed job file goes to failed/ with its line; a bad
/// config names its line; an unknown repository is refused at submit.
#[test]
fn bad_job_files_and_configs_are_named_and_nothing_is_lost() {
    let w = ws();
    w.config("host", "", "");
    std::fs::create_dir_all(w.queue().join("inbox")).unwrap();
    std::fs::write(
        w.queue().join("inbox").join("jbroken.json"),
        "{\n \"id\": \"jbroken\",\n \"sender\": 7\n}",
    )
    .unwrap();
    let good = w.submit(&[], "@@say fine");
    w.work_once(&[]);
    assert_eq!(w.record(&good)["status"], "no_changes");
    let reason = std::fs::read_to_string(w.queue().join("failed/jbroken.json.reason")).unwrap();
    assert!(reason.contains("jbroken.json:3:"), "{reason}");
    assert!(
        w.queue().join("failed/jbroken.json").exists(),
        "the file is kept"
    );
    let o = w
        .cmd()
        .args(["submit", "--repo", "elsewhere", "x"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("does not list"), "{}", text(&o));
    std::fs::write(
        w.path("jobs.toml"),
        "queue = \"queue\"\n[agent]\nspek = 1\n",
    )
    .unwrap();
    let o = w.cmd().arg("list").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("jobs.toml:3:1: unknown field `spek`"),
        "{}",
        text(&o)
    );
}

fn xmpp_config(w: &Ws, port: u16, repo_extra: &str) {
    w.config(
        "container",
        repo_extra,
        &xmpp_table(port, "batch_window_ms = 1500\nchunk_pause_ms = 100\n"),
    );
}

/// The `[xmpp]` table for the test server on `port` (the friend allowed),
/// with `extra` keys.
fn xmpp_table(port: u16, extra: &str) -> String {
    format!(
        "[xmpp]\njid = \"builder@localhost\"\npassword_env = \"BELAY_TEST_XMPP_PW\"\nserver = \"127.0.0.1:{port}\"\ninsecure_plaintext_loopback = true\nallow = [\"friend@localhost\"]\n{extra}"
    )
}

/// `belay jobs work` with the chat front end; its stderr goes to
/// `work.log` (shown when a wait fails).
fn spawn_xmpp_work(w: &Ws) -> Child {
    let log = std::fs::File::create(w.path("work.log")).unwrap();
    let mut c = w.cmd();
    c.env("BELAY_TEST_XMPP_PW", xmpp::PASSWORD)
        .env(
            "BELAY_LOG",
            std::env::var("BELAY_TEST_LOG").unwrap_or("warn,belay_jobs=info".into()),
        )
        .arg("work")
        .stdout(Stdio::null())
        .stderr(log);
    c.spawn().unwrap()
}

fn stop(w: &Ws, child: Child) -> String {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let mut child = child;
    child.wait().unwrap();
    std::fs::read_to_string(w.path("work.log")).unwrap_or_default()
}

/// The owner's request over XMPP (two messages within the window: one job)
/// runs in a container in its own worktree, is committed and pushed by
/// belay (the agent's own commit fails), and the owner gets the reply with
/// the commit hash; the record says so.
#[test]
fn a_job_from_chat_end_to_end() {
    require_agent_image();
    let w = ws();
    let server = xmpp::Prosody::start(&w.path("xmpp"), &["builder", "owner", "friend"]);
    xmpp_config(&w, server.port, "");
    let worker = spawn_xmpp_work(&w);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    std::thread::sleep(Duration::from_secs(2));
    owner.send(
        "builder@localhost",
        "@@write index.html <h1>from chat</h1>\n@@sneak",
    );
    std::thread::sleep(Duration::from_millis(300));
    owner.send(
        "builder@localhost",
        "@@say done\n@@commit site: a title from chat",
    );
    let all = owner.wait_for("committed and pushed to main", Duration::from_secs(120));
    let head = git(&w.remote, &["rev-parse", "main"]);
    assert!(
        all.contains(&head),
        "the reply names the commit {head}: {all}"
    );
    assert!(
        all.contains("Note: I am belay's builder"),
        "the first reply has the notice: {all}"
    );
    assert!(
        all.contains("SNEAK-REFUSED") && !all.contains("SNEAK-WROTE-GIT"),
        "{all}"
    );
    let log = w.remote_log();
    assert_eq!(log[0], "site: a title from chat|belay builder", "{log:?}");
    assert_eq!(log.len(), 2);
    assert_eq!(
        git(&w.remote, &["show", "main:index.html"]),
        "<h1>from chat</h1>"
    );
    let done: Vec<String> = std::fs::read_dir(w.queue().join("done"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        done.len(),
        1,
        "two messages within the window are one job: {done:?}"
    );
    let id = done[0].trim_end_matches(".json").to_string();
    let r = w.record(&id);
    assert_eq!(r["status"], "committed");
    assert_eq!(r["commits"][0]["hash"], head.as_str());
    assert_eq!(r["commits"][0]["repo"], "site");
    assert_eq!(r["commits"][0]["branch"], "main");
    assert!(r["runtime"].as_str().unwrap().starts_with("cmd:"));
    assert_eq!(r["configured_profile"]["iteration_limit"], 20);
    assert!(r["telemetry"]["duration_s"].as_f64().unwrap() > 0.0);
    // /status and /jobs answer at once.
    owner.send("builder@localhost", "/status");
    owner.wait_for("Queue: inbox: 0", Duration::from_secs(20));
    let err = stop(&w, worker);
    assert!(err.contains("online as builder@localhost"), "{err}");
}

/// A third party's request waits for /annehmen and /ablehnen drops it; a
/// repository with commit approval holds the change until /freigeben
/// (committed) or /verwerfen (no trace in the repository).
#[test]
fn chat_gates_start_and_commit_approval() {
    require_agent_image();
    let w = ws();
    let server = xmpp::Prosody::start(&w.path("xmpp"), &["builder", "owner", "friend"]);
    xmpp_config(&w, server.port, "commit_approval = true");
    let worker = spawn_xmpp_work(&w);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    let friend = xmpp::Chat::connect("friend", server.port, &w.path("work.log"));
    std::thread::sleep(Duration::from_secs(2));
    friend.send(
        "builder@localhost",
        "@@write index.html <h1>friend</h1>\n@@commit friend's title",
    );
    let asked = owner.wait_for_nth(
        "New request from friend@localhost",
        1,
        Duration::from_secs(30),
    );
    let id = asked
        .split("(ID ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .to_string();
    assert!(
        asked.contains("repositories: site; role: builder; iteration limit: 20"),
        "{asked}"
    );
    friend.wait_for("waits for the owner's approval", Duration::from_secs(10));
    assert!(w.jobs_in("pending").contains(&id));
    // A third party cannot pass the gate itself.
    friend.send("builder@localhost", &format!("/annehmen {id}"));
    friend.wait_for("Only the owner may use /accept", Duration::from_secs(10));
    owner.send("builder@localhost", &format!("/annehmen {id}"));
    owner.wait_for(
        &format!("Job {id} from friend@localhost accepted"),
        Duration::from_secs(10),
    );
    // It runs, and its commit waits for approval.
    owner.wait_for(
        &format!("Job {id} from friend@localhost waits for your commit approval"),
        Duration::from_secs(120),
    );
    assert_eq!(w.remote_log().len(), 1, "held: nothing pushed yet");
    owner.send("builder@localhost", &format!("/freigeben {id}"));
    owner.wait_for(&format!("Job {id} approved"), Duration::from_secs(60));
    friend.wait_for(&format!("Job {id} approved"), Duration::from_secs(20));
    assert_eq!(w.remote_log()[0], "friend's title|belay builder");
    assert_eq!(w.record(&id)["status"], "committed");
    // Declined unseen.
    friend.send(
        "builder@localhost",
        "@@write index.html never\n@@commit never",
    );
    let asked = owner.wait_for_nth(
        "New request from friend@localhost",
        2,
        Duration::from_secs(30),
    );
    let second = asked
        .split("(ID ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .to_string();
    assert_ne!(second, id);
    owner.send("builder@localhost", &format!("/ablehnen {second}"));
    owner.wait_for(&format!("Job {second} declined"), Duration::from_secs(10));
    assert!(
        !w.queue().join("runs").join(&second).exists(),
        "a declined job never ran"
    );
    assert_eq!(w.record(&second)["status"], "declined");
    // The owner's own job is held too, and /verwerfen leaves no trace.
    let refs_before = git(&w.repo, &["for-each-ref"]);
    owner.send(
        "builder@localhost",
        "@@write index.html <h1>discard me</h1>\n@@write added.sh echo new\n@@commit discard me",
    );
    let held = owner.wait_for_nth(
        "waits for your commit approval",
        2,
        Duration::from_secs(120),
    );
    let third = held
        .strip_prefix("Job ")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    assert_ne!(third, id);
    // The owner is shown every path the change holds, new files too.
    assert!(
        held.contains("A\tadded.sh") && held.contains("M\tindex.html"),
        "{held}"
    );
    assert_eq!(
        git(&w.repo, &["stash", "list"]).lines().count(),
        1,
        "the held change is a stash"
    );
    owner.send("builder@localhost", &format!("/verwerfen {third}"));
    owner.wait_for(&format!("Job {third} discarded"), Duration::from_secs(30));
    assert_eq!(git(&w.repo, &["stash", "list"]), "");
    assert_eq!(
        git(&w.repo, &["for-each-ref"]),
        refs_before,
        "a ref was left"
    );
    assert_eq!(git(&w.repo, &["worktree", "list"]).lines().count(), 1);
    assert_eq!(w.remote_log().len(), 2);
    assert_eq!(
        git(&w.remote, &["show", "main:index.html"]),
        "<h1>friend</h1>"
    );
    stop(&w, worker);
}

/// What a person in the chat hears between a request and its result: the
/// job is queued (and where it stands), started, and ended; a stranger hears
/// that the owner accepted, and the owner who accepted hears how it ended.
/// A long answer comes as its head and a pointer to the whole text (kept
/// in the job's run; that conversations take turns in the outbox is the
/// front end's unit test). `/jobs` shows the finished jobs, and `/requeue` runs a failed one again.
#[test]
fn chat_progress_history_requeue_and_long_answers() {
    let w = ws();
    let server = xmpp::Prosody::start(&w.path("xmpp"), &["builder", "owner", "friend"]);
    w.config(
        "host",
        "",
        &xmpp_table(
            server.port,
            "batch_window_ms = 500\nchunk_pause_ms = 300\nchunk_chars = 400\nlong_answer_chars = 1000\ndashboard_url = \"http://127.0.0.1:8377/\"\n",
        ),
    );
    let worker = spawn_xmpp_work(&w);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    let friend = xmpp::Chat::connect("friend", server.port, &w.path("work.log"));
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    owner.send(
        "builder@localhost",
        "@@say short\n@@write index.html <h1>one</h1>\n@@commit one",
    );
    let got = owner.wait_for("Got it: job ", Duration::from_secs(20));
    let first_reply = t0.elapsed();
    let id = got
        .split("Got it: job ")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(got.contains("it starts next"), "{got}");
    owner.wait_for(&format!("Job {id} started."), Duration::from_secs(20));
    let started = t0.elapsed();
    owner.wait_for("committed and pushed to main", Duration::from_secs(60));
    println!("CHAT-PROGRESS message to first reply {first_reply:?}, to job start {started:?}");
    // A stranger's request: accepted, started, ended, each told.
    friend.send(
        "builder@localhost",
        "@@write README.md from a friend\n@@commit friend",
    );
    let asked = owner.wait_for_nth(
        "New request from friend@localhost",
        1,
        Duration::from_secs(30),
    );
    let fid = asked
        .split("(ID ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .to_string();
    owner.send("builder@localhost", &format!("/accept {fid}"));
    friend.wait_for(
        &format!("Your request {fid} was accepted"),
        Duration::from_secs(20),
    );
    friend.wait_for(&format!("Job {fid} started."), Duration::from_secs(20));
    owner.wait_for(
        &format!("Job {fid} from friend@localhost, which you accepted, ended: committed."),
        Duration::from_secs(60),
    );
    // A long answer: its head, and where the whole text is.
    owner.send("builder@localhost", "@@long 200");
    let lid_msg = owner.wait_for_nth("Got it: job ", 2, Duration::from_secs(20));
    let lid = lid_msg
        .split("Got it: job ")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    owner.wait_for(&format!("Job {lid} started."), Duration::from_secs(20));
    let long = owner.wait_for(
        "more characters; the whole answer: http://127.0.0.1:8377/#/run/",
        Duration::from_secs(60),
    );
    assert!(long.contains(&format!("#/run/{lid}")), "{long}");
    assert!(
        !long.contains("the end of the long answer"),
        "the whole answer went to the chat"
    );
    let whole =
        std::fs::read_to_string(w.queue().join("runs").join(&lid).join("answer.md")).unwrap();
    assert!(
        whole.contains("line 199 of the long answer")
            && whole.contains("the end of the long answer"),
        "{whole}"
    );
    // /jobs: nothing waits, the recent finished jobs with how they ended.
    owner.send("builder@localhost", "/jobs");
    let jobs = owner.wait_for("Recent (", Duration::from_secs(20));
    let listing = jobs.rsplit("No jobs waiting.").next().unwrap();
    for j in [&id, &fid, &lid] {
        assert!(
            listing.contains(&format!("{j} [")),
            "{j} is not in /jobs: {listing}"
        );
    }
    assert!(listing.contains(&format!("{id} [committed]")), "{listing}");
    // The friend sees only theirs.
    friend.send("builder@localhost", "/jobs");
    let theirs = friend.wait_for("Recent (", Duration::from_secs(20));
    let theirs = theirs.rsplit("No jobs waiting.").next().unwrap();
    assert!(theirs.contains(&fid) && !theirs.contains(&id), "{theirs}");
    // A failed job, requeued from the chat, runs again.
    owner.send("builder@localhost", "@@fail");
    let fail_msg = owner.wait_for_nth("Got it: job ", 3, Duration::from_secs(20));
    let xid = fail_msg
        .split("Got it: job ")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let t = Instant::now();
    while !w.jobs_in("failed").contains(&xid) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the job did not fail"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    friend.send("builder@localhost", &format!("/requeue {xid}"));
    friend.wait_for("Only the owner may use /requeue", Duration::from_secs(10));
    owner.send("builder@localhost", &format!("/requeue {xid}"));
    owner.wait_for(
        &format!("Job {xid} is back in the inbox"),
        Duration::from_secs(20),
    );
    owner.wait_for_nth(&format!("Job {xid} started."), 2, Duration::from_secs(30));
    stop(&w, worker);
}

/// prosody restarted mid-session: belay reconnects, answers the next
/// message, and a message delivered again (same id) makes no second job.
#[test]
fn chat_survives_a_server_restart_without_duplicate_jobs() {
    require_agent_image();
    let w = ws();
    let mut server = xmpp::Prosody::start(&w.path("xmpp"), &["builder", "owner", "friend"]);
    xmpp_config(&w, server.port, "");
    let worker = spawn_xmpp_work(&w);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    std::thread::sleep(Duration::from_secs(2));
    owner.send_with_id("builder@localhost", "@@say first answer", "msg-1");
    owner.wait_for("first answer", Duration::from_secs(120));
    server.restart();
    // A new client for the owner (tokio-xmpp's own reconnect would try to
    // resume the session the restarted server forgot).
    drop(owner);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    // The bot is back once it answers.
    let t = Instant::now();
    loop {
        owner.send("builder@localhost", "/status");
        std::thread::sleep(Duration::from_secs(1));
        if owner.count("Queue:") > 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "belay did not come back after the restart"
        );
    }
    owner.send_with_id("builder@localhost", "@@say second answer", "msg-2");
    owner.wait_for("second answer", Duration::from_secs(120));
    // The same message again (as a server redelivers it): no job.
    owner.send_with_id("builder@localhost", "@@say second answer", "msg-2");
    std::thread::sleep(Duration::from_secs(4));
    let done = std::fs::read_dir(w.queue().join("done")).unwrap().count();
    assert_eq!(done, 2, "one job per message");
    assert_eq!(owner.count("second answer"), 1);
    let err = stop(&w, worker);
    assert!(
        err.matches("online as builder@localhost").count() >= 2,
        "{err}"
    );
    // No reconnect storm: tokio-xmpp reconnects by itself, and after the
    // restarted server refused to resume the stream it logged in hundreds of
    // times (497 and 573 in two runs) until belay made a new client; every
    // connection is paced now.
    let log = std::fs::read_to_string(server.dir.join("prosody.log")).unwrap_or_default();
    let logins = log.matches("Authenticated as builder@localhost").count();
    eprintln!("belay's logins across the restart: {logins}");
    assert!((2..=12).contains(&logins), "{logins} logins:\n{err}");
}

/// The server is down for ten seconds: belay tries a handful of connections
/// while it is down (paced: 1 s, 2 s, 4 s, …), logs in a handful of times
/// once it is back, and answers again; the figures are printed. A request
/// that came before the outage is a job of its own, never merged with one
/// that came after it on the new connection.
#[test]
fn a_ten_second_outage_costs_a_handful_of_connections() {
    let w = ws();
    let mut server = xmpp::Prosody::start(&w.path("xmpp"), &["builder", "owner", "friend"]);
    w.config(
        "host",
        "",
        &xmpp_table(
            server.port,
            "batch_window_ms = 30000\nchunk_pause_ms = 100\n",
        ),
    );
    let friend = xmpp::Chat::connect("friend", server.port, &w.path("work.log"));
    let worker = spawn_xmpp_work(&w);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    std::thread::sleep(Duration::from_secs(2));
    owner.send("builder@localhost", "/status");
    owner.wait_for("Queue:", Duration::from_secs(20));
    let connecting = || {
        std::fs::read_to_string(w.path("work.log"))
            .unwrap_or_default()
            .matches("xmpp: connecting as builder@localhost")
            .count()
    };
    let logins = |server: &xmpp::Prosody| {
        std::fs::read_to_string(server.dir.join("prosody.log"))
            .unwrap_or_default()
            .matches("Authenticated as builder@localhost")
            .count()
    };
    // Inside its (long) batching window when the server goes.
    friend.send("builder@localhost", "before the outage");
    std::thread::sleep(Duration::from_millis(500));
    let (c0, l0) = (connecting(), logins(&server));
    server.restart_after(Duration::from_secs(10));
    let during = connecting() - c0;
    let back = Instant::now();
    drop(owner);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    loop {
        owner.send("builder@localhost", "/status");
        std::thread::sleep(Duration::from_millis(500));
        if owner.count("Queue:") > 0 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(90),
            "belay did not come back"
        );
    }
    let answered = back.elapsed();
    drop(friend);
    let friend = xmpp::Chat::connect("friend", server.port, &w.path("work.log"));
    friend.send("builder@localhost", "after the outage");
    let pending = || {
        job_queue::jobs_in(&w.queue(), "pending")
            .iter()
            .map(|id| {
                std::fs::read_to_string(w.queue().join("pending").join(format!("{id}.json")))
                    .unwrap()
            })
            .collect::<Vec<String>>()
    };
    let t = Instant::now();
    while pending().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the request before the outage is no job"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let jobs = pending();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(
        jobs[0].contains("before the outage") && !jobs[0].contains("after the outage"),
        "a batch spans the reconnection: {jobs:?}"
    );
    std::thread::sleep(Duration::from_secs(10));
    let after = logins(&server) - l0;
    let after_connecting = connecting() - c0 - during;
    let log = stop(&w, worker);
    if std::env::var_os("BELAY_TEST_SHOW_LOG").is_some() {
        eprintln!("{log}");
    }
    println!(
        "XMPP-OUTAGE 10 s: {during} connection attempts during it; {after_connecting} attempts and {after} logins until 10 s after it answered; answering again {answered:?} after it"
    );
    assert!(
        (1..=8).contains(&during),
        "{during} connection attempts in a 10 s outage"
    );
    assert!((1..=4).contains(&after), "{after} logins after the outage");
}

/// The repository's checks run in the sandbox before the commit (a failure
/// is `check_failed` with the output, nothing pushed); a secret the agent
/// writes is refused at the commit and is in no file belay wrote; the
/// on-commit hook gets the record once per commit.
#[test]
fn checks_secrets_and_the_on_commit_hook() {
    require_agent_image();
    let w = ws();
    let hook = w.path("hook.sh");
    common::install_script(
        &hook,
        "#!/bin/sh\nrec=$(cat)\necho \"$BELAY_JOB_ID $BELAY_COMMITS $1\" >> \"$(dirname \"$0\")/hook.log\"\nprintf '%s' \"$rec\" | grep -q '\"status\": \"committed\"' || exit 9\n",
    );
    w.config(
        "container",
        "checks = [\"grep -q ok index.html\"]",
        &format!("[hooks]\non_commit = [\"{}\"]\n", hook.display()),
    );
    // pass_env goes in [agent]: rewrite the file with it.
    let cfg = std::fs::read_to_string(w.path("jobs.toml"))
        .unwrap()
        .replace(
            "wall_time_s = 120\n",
            "wall_time_s = 120\npass_env = [\"CANARY_TOKEN\"]\n",
        );
    std::fs::write(w.path("jobs.toml"), cfg).unwrap();
    let canary = "canary-7f3e9a1c5b2d4e6f8a0b";
    let run = |args: &[&str], body: &str| -> String {
        let id = w.submit(args, body);
        let o = w
            .cmd()
            .env("CANARY_TOKEN", canary)
            .args(["work", "--once"])
            .output()
            .unwrap();
        // A job that failed its checks fails the run, and says why.
        if w.record(&id)["status"] == "committed" {
            ok(&o);
        } else {
            assert_eq!(o.status.code(), Some(1), "{}", show(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(&format!("job {id} check_failed: ")), "{err}");
        }
        id
    };
    let bad = run(&[], "@@write index.html not yet\n@@commit try");
    let r = w.record(&bad);
    assert_eq!(r["status"], "check_failed", "{r}");
    assert!(
        r["report"]
            .as_str()
            .unwrap()
            .contains("grep -q ok index.html` failed (exit 1)"),
        "{r}"
    );
    assert_eq!(w.remote_log().len(), 1);
    let good = run(&[], "@@write index.html ok now\n@@commit checked");
    let r = w.record(&good);
    assert_eq!(r["status"], "committed", "{r}");
    let hash = r["commits"][0]["hash"].as_str().unwrap().to_string();
    let hook_log = std::fs::read_to_string(w.path("hook.log")).unwrap();
    assert_eq!(hook_log.lines().count(), 1, "{hook_log}");
    assert!(
        hook_log.starts_with(&format!("{good} {hash} ")),
        "{hook_log}"
    );
    assert!(
        hook_log.trim_end().ends_with(&format!("done/{good}.json")),
        "{hook_log}"
    );
    // An agent that writes the token it was passed into the tree.
    let leaker = w.path("leaker.sh");
    common::install_script(
        &leaker,
        "#!/bin/sh\ncat >/dev/null\necho ok > index.html\necho \"$CANARY_TOKEN\" > token.txt\necho done\nprintf '===COMMIT-MESSAGE===\\nleak\\n===END-COMMIT-MESSAGE===\\n'\n",
    );
    let leak = run(
        &["--agent", &format!("cmd:{}", leaker.display())],
        "write the token",
    );
    let r = w.record(&leak);
    assert_eq!(r["status"], "check_failed", "{r}");
    assert!(
        r["report"]
            .as_str()
            .unwrap()
            .contains("contains the value of secret `CANARY_TOKEN`"),
        "{r}"
    );
    assert_eq!(w.remote_log().len(), 2, "only the checked commit is pushed");
    let found = replay::files_containing(w.queue().as_path(), canary);
    assert!(found.is_empty(), "the secret is in {found:?}");
    assert_eq!(
        std::fs::read_to_string(w.path("hook.log"))
            .unwrap()
            .lines()
            .count(),
        1,
        "the hook ran for a commit only"
    );
    // A link out of the tree is refused; one inside it is fine.
    let out = run(
        &[],
        "@@write index.html ok\n@@link key /etc/passwd\n@@commit a link out",
    );
    let r = w.record(&out);
    assert_eq!(r["status"], "check_failed", "{r}");
    assert!(
        r["report"]
            .as_str()
            .unwrap()
            .contains("points outside the repository (key -> /etc/passwd)"),
        "{r}"
    );
    let up = run(
        &[],
        "@@write index.html ok\n@@link up ../../x\n@@commit a link up",
    );
    assert_eq!(w.record(&up)["status"], "check_failed");
    let inside = run(
        &[],
        "@@write index.html ok, linked\n@@link home.html index.html\n@@commit a link inside",
    );
    assert_eq!(
        w.record(&inside)["status"],
        "committed",
        "{}",
        w.record(&inside)
    );
    assert_eq!(w.remote_log().len(), 3);
}

/// The HTTP endpoint: a token or 401, a job submitted and its record read
/// back; the drop directory: a text file becomes a job, a broken JSON file
/// goes to failed/ with the reason.
#[test]
fn http_and_drop_front_ends() {
    let w = ws();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    w.config(
        "host",
        "",
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\ntoken_env = \"BELAY_TEST_HTTP_TOKEN\"\ntrusted = true\n[drop]\ndir = \"drop\"\npoll_ms = 100\ntrusted = true\n"),
    );
    let token = "tok-0123456789abcdef0123";
    let log = std::fs::File::create(w.path("work.log")).unwrap();
    let mut child = w
        .cmd()
        .env("BELAY_TEST_HTTP_TOKEN", token)
        .arg("work")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/jobs");
    let curl = |args: &[&str]| -> (String, String) {
        let o = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "--max-time", "10"])
            .args(args)
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = s.rsplit_once('\n').unwrap_or(("", ""));
        (body.to_string(), code.to_string())
    };
    let t = Instant::now();
    while curl(&[&url]).1 != "401" {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the endpoint did not come up: {}",
            std::fs::read_to_string(w.path("work.log")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let auth = format!("Authorization: Bearer {token}");
    let bad = curl(&["-H", "Authorization: Bearer wrong-token-000000000", &url]);
    assert_eq!(bad.1, "401");
    let (body, code) = curl(&[
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        "{\"body\":\"@@say from http\",\"board_slug\":\"b1\"}",
        &url,
    ]);
    assert_eq!(code, "201", "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, code) = curl(&[
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"body":"x","owner":true}"#,
        &url,
    ]);
    assert_eq!(code, "400", "unknown fields are refused");
    let t = Instant::now();
    let rec = loop {
        let (body, code) = curl(&["-H", &auth, &format!("{url}/{id}")]);
        assert_eq!(code, "200", "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["state"] == "done" {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(rec["record"]["status"], "no_changes", "{rec}");
    assert_eq!(rec["record"]["board_slug"], "b1");
    assert!(rec["record"]["report"]
        .as_str()
        .unwrap()
        .contains("from http"));
    // The drop directory.
    std::fs::write(w.path("drop/req.txt"), "@@say from a file\n").unwrap();
    std::fs::write(w.path("drop/broken.json"), "{\"body\": 3}").unwrap();
    let t = Instant::now();
    while !w.queue().join("failed/broken.json.reason").exists()
        || std::fs::read_dir(w.queue().join("done")).unwrap().count() < 2
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{}",
            std::fs::read_to_string(w.path("work.log")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let reason = std::fs::read_to_string(w.queue().join("failed/broken.json.reason")).unwrap();
    assert!(reason.contains("broken.json:1:"), "{reason}");
    assert!(!w.path("drop/req.txt").exists() && !w.path("drop/broken.json").exists());
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

/// The bundled example: three jobs, two commits by belay.
#[test]
fn the_bundled_example_runs() {
    require_agent_image();
    let tmp = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/jobs-demo/run.sh");
    let o = Command::new(script)
        .env("BELAY", env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", tmp.path())
        .output()
        .unwrap();
    ok(&o);
    let out = text(&o);
    assert!(out.contains("belay builder: site: a footer"), "{out}");
    assert!(
        out.contains("belay builder: site: the title says Welcome"),
        "{out}"
    );
    assert_eq!(out.matches(": committed").count(), 2, "{out}");
    assert_eq!(out.matches(": no_changes").count(), 1, "{out}");
    assert!(
        out.contains("waits for the owner's approval") || out.contains("pending"),
        "{out}"
    );
}

/// A third party's job cannot choose what runs or where the record goes,
/// nor name a repository by path; a gate needs an owner.
#[test]
fn a_third_party_cannot_choose_the_agent_or_pass_a_gate() {
    let w = ws();
    w.config("host", "", "");
    for (args, why) in [
        (vec!["--agent", "cmd:/bin/sh"], "choose the agent"),
        (vec!["--model", "gpt-5"], "choose the runtime, the model"),
        (vec!["--on-complete", "/tmp"], "say where the record goes"),
        (vec!["--repo", "/etc"], "does not list"),
    ] {
        let o = w
            .cmd()
            .args(["submit", "--sender", "friend@localhost"])
            .args(&args)
            .arg("x")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(why), "{args:?}: {}", text(&o));
    }
    let o = w
        .cmd()
        .args(["submit", "--model=--rm", "x"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("is not a model name"), "{}", text(&o));
    let o = w
        .cmd()
        .args(["submit", "--sender", "friend@localhost", "@@say hi"])
        .output()
        .unwrap();
    ok(&o);
    let id = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(w.jobs_in("pending"), vec![id.clone()]);
    // The owners are asked (with no chat configured, on belay's log).
    assert!(
        text(&o).contains(&format!("New request from friend@localhost (ID {id})")),
        "{}",
        text(&o)
    );
    assert!(w.outbox().is_empty(), "no chat: nothing is kept to send");
    // A worker does not run it; the owner's decline drops it.
    w.work_once(&[]);
    assert_eq!(w.jobs_in("pending"), vec![id.clone()]);
    ok(&w.cmd().args(["decline", &id]).output().unwrap());
    assert!(w.jobs_in("pending").is_empty());
    assert_eq!(w.record(&id)["status"], "declined");
    // Its id is taken for good.
    let o = w.cmd().args(["requeue", &id]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// `push = false`: belay commits on the job branch, keeps it, and pushes
/// nothing.
#[test]
fn without_push_the_commit_stays_on_the_job_branch() {
    let w = ws();
    w.config("host", "push = false", "");
    let id = w.submit(&[], "@@write index.html <h1>local</h1>\n@@commit kept here");
    w.work_once(&[]);
    let r = w.record(&id);
    assert_eq!(r["status"], "committed", "{r}");
    let branch = format!("builder-job-{id}");
    assert_eq!(r["commits"][0]["branch"], branch.as_str());
    assert!(
        r["report"]
            .as_str()
            .unwrap()
            .contains("not pushed (push = false)"),
        "{r}"
    );
    assert_eq!(
        git(&w.repo, &["log", "-1", "--format=%s", &branch]),
        "kept here"
    );
    assert_eq!(w.remote_log().len(), 1, "nothing was pushed");
}

/// A job that fails before its agent runs (its repository is gone) has one
/// start record and one end record in the registry, and shows as failed
/// with its reason: never as interrupted, never started twice.
#[test]
fn a_job_failing_before_its_agent_has_one_start_and_one_end() {
    let w = ws();
    w.config("host", "", "");
    let id = w.submit(&[], "@@write index.html never");
    std::fs::rename(&w.repo, w.path("site-moved")).unwrap();
    let o = w.cmd().args(["work", "--once"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let reg = std::fs::read_to_string(w.path("state").join("runs.jsonl")).unwrap();
    let mine: Vec<Value> = reg
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["run_id"] == id.as_str())
        .collect();
    let ops: Vec<&str> = mine.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["start", "end"], "{mine:?}");
    let list = Command::new(env!("CARGO_BIN_EXE_belay"))
        .env("BELAY_STATE_HOME", w.path("state"))
        .args(["runs", "list", "--json"])
        .output()
        .unwrap();
    // One JSON object a line.
    let row: Value = text(&list)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["run_id"] == id.as_str())
        .unwrap_or_else(|| panic!("{}", show(&list)));
    assert_eq!(row["status"], "failed", "{row}");
    assert!(row["summary"].as_str().unwrap().contains("failed"), "{row}");
}

/// A held change that no longer applies (the branch moved under it) is
/// refused with git's own account of the conflict, and nothing is committed
/// or lost: the job stays held, its patch on record, until it is discarded.
#[test]
fn a_held_change_that_no_longer_applies_says_why_in_gits_words() {
    let w = ws();
    w.config("host", "commit_approval = true", "");
    let id = w.submit(
        &[],
        "@@write index.html <h1>held</h1>\n@@commit the held title",
    );
    w.work_once(&[]);
    assert_eq!(w.jobs_in("held"), vec![id.clone()]);
    let patch =
        std::fs::read_to_string(w.queue().join("runs").join(&id).join("held.diff")).unwrap();
    assert!(
        patch.contains("# repository site")
            && patch.contains("-<h1>hello</h1>")
            && patch.contains("+<h1>held</h1>"),
        "the held patch is not recorded whole: {patch}"
    );
    // Someone else changes the same line upstream.
    let other = w.path("other");
    git(
        w.tmp.path(),
        &[
            "clone",
            "-q",
            w.remote.to_str().unwrap(),
            other.to_str().unwrap(),
        ],
    );
    std::fs::write(other.join("index.html"), "<h1>theirs</h1>\n").unwrap();
    git(
        &other,
        &[
            "-c",
            "user.name=o",
            "-c",
            "user.email=o@x",
            "commit",
            "-qam",
            "theirs",
        ],
    );
    git(&other, &["push", "-q", "origin", "main"]);
    let o = w.cmd().args(["approve", &id]).output().unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no longer applies") && err.contains("CONFLICT") && err.contains("index.html"),
        "git's account of the conflict is not shown: {err}"
    );
    assert!(err.contains(&format!("discard job {id}")), "{err}");
    assert!(
        !err.contains("/discard"),
        "a chat command on the terminal: {err}"
    );
    assert_eq!(
        w.remote_log()[0],
        "theirs|o",
        "nothing of the job is pushed"
    );
    assert_eq!(w.jobs_in("held"), vec![id.clone()], "the held job is kept");
    let o = w.cmd().args(["discard", &id]).output().unwrap();
    ok(&o);
    // One start record for the job's run, whatever came after its hold (a
    // refused approval, a discard): its last end record says how it ended.
    let reg = std::fs::read_to_string(w.path("state").join("runs.jsonl")).unwrap();
    let ops: Vec<String> = reg
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["run_id"] == id.as_str())
        .map(|r| r["op"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ops.iter().filter(|o| *o == "start").count(), 1, "{ops:?}");
    assert_eq!(ops.last().map(String::as_str), Some("end"), "{ops:?}");
}

/// Each real agent CLI (codex, Claude Code, gemini), pinned under
/// /opt/belay-agents, is the job agent in its container against the scripted
/// model server, in its own dialect: its shell tool call writes a file, the
/// repository's check runs in the sandbox, and belay commits and pushes the
/// file. Nothing is configured but the spec and the URL: the key is taken
/// from the CLI's own variable (and is in no file of the queue), and in its
/// container the CLI's tools are approved without `auto_approve`.
#[test]
fn each_real_cli_as_the_job_agent_writes_a_checked_and_pushed_file() {
    require_agent_image();
    for (cli, spec, api, tool, arg, key_env) in [
        (
            "codex",
            "codex@gpt-5-codex",
            "responses",
            "exec_command",
            "cmd",
            "OPENAI_API_KEY",
        ),
        (
            "claude",
            "claude@claude-sonnet-4-5",
            "anthropic",
            "Bash",
            "command",
            "ANTHROPIC_API_KEY",
        ),
        (
            "gemini",
            "gemini@gemini-2.5-flash",
            "gemini",
            "run_shell_command",
            "command",
            "GEMINI_API_KEY",
        ),
    ] {
        let w = ws();
        let script = r#"
turns:
  - name: job-edit
    match: {api: @API@, contains: "MATRIX-JOB: add hello.txt"}
    reply:
      tool_calls:
        - name: @TOOL@
          arguments: {@ARG@: "echo 'written by @CLI@' > hello.txt && echo job-edit-done"}
  - name: job-done
    match: {api: @API@, contains: "job-edit-done"}
    reply: {text: "I wrote hello.txt.\n===COMMIT-MESSAGE===\nadd hello.txt by @CLI@\n===END-COMMIT-MESSAGE===\n"}
"#
        .replace("@API@", api)
        .replace("@TOOL@", tool)
        .replace("@ARG@", arg)
        .replace("@CLI@", cli);
        let server = replay::Replay::start(w.tmp.path(), &script);
        let check = format!("grep -q 'written by {cli}' hello.txt");
        w.config("container", &format!("checks = [\"{check}\"]"), "");
        let cfg = std::fs::read_to_string(w.path("jobs.toml"))
            .unwrap()
            .replace(
                &format!("spec = \"cmd:{}\"\n", w.agent.display()),
                &format!("spec = \"{spec}\"\nmodel_url = \"{}\"\n", server.url),
            );
        assert!(cfg.contains(spec), "{cfg}");
        std::fs::write(w.path("jobs.toml"), cfg).unwrap();
        let key = format!("sk-test-jobs-{cli}-0123456789abcdef");
        let id = w.submit(&[], "MATRIX-JOB: add hello.txt saying who wrote it");
        let t = Instant::now();
        let o = w
            .cmd()
            .env(key_env, &key)
            .args(["work", "--once"])
            .output()
            .unwrap();
        ok(&o);
        let took = t.elapsed();
        let r = w.record(&id);
        assert_eq!(r["status"], "committed", "{cli}: {r}");
        assert_eq!(r["runtime"], spec, "{cli}: {r}");
        assert_eq!(r["commits"][0]["repo"], "site", "{cli}: {r}");
        assert_eq!(r["commits"][0]["branch"], "main", "{cli}: {r}");
        assert_eq!(
            r["commits"][0]["hash"].as_str().unwrap(),
            git(&w.remote, &["rev-parse", "main"]),
            "{cli}"
        );
        assert!(
            r["report"]
                .as_str()
                .unwrap()
                .contains("committed and pushed to main"),
            "{cli}: {r}"
        );
        // The file the CLI wrote is what was pushed, in belay's commit.
        assert_eq!(
            git(&w.remote, &["show", "main:hello.txt"]),
            format!("written by {cli}")
        );
        assert_eq!(
            w.remote_log(),
            [
                format!("add hello.txt by {cli}|belay builder"),
                "initial|belay-test".to_string()
            ]
        );
        assert!(
            !w.repo.join("hello.txt").exists(),
            "{cli}: the checkout changed"
        );
        // The check ran, before the commit, and passed.
        let ev = w.events(&id);
        let checks = ev
            .iter()
            .find(|e| e["kind"] == "checks_ran")
            .unwrap_or_else(|| panic!("{cli}: no checks_ran in {ev:#?}"));
        assert_eq!(checks["data"]["passed"], true, "{cli}: {checks}");
        assert_eq!(
            checks["data"]["commands"][0]["command"],
            check.as_str(),
            "{cli}"
        );
        // The model server was spoken to in the CLI's own dialect, both turns.
        let reqs = server.requests();
        let used: Vec<&str> = reqs
            .iter()
            .filter_map(|r| r["turn_name"].as_str())
            .collect();
        assert_eq!(used, ["job-edit", "job-done"], "{cli}");
        assert!(
            reqs.iter()
                .filter(|r| r["turn_name"].is_string())
                .all(|r| r["api"] == api),
            "{cli}: {reqs:#?}"
        );
        let found = replay::files_containing(w.queue().as_path(), &key);
        assert!(found.is_empty(), "{cli}: the key is in {found:?}");
        eprintln!("{cli}: the job took {took:?}");
    }
}

/// A check that starts a program the agent's image does not have (`python3`
/// in belay-agent:bookworm) would fail after the agent's whole session: the
/// job is refused before the agent runs, saying which env build makes an
/// image that has it, and nothing reaches the remote.
#[test]
fn a_check_the_image_cannot_run_fails_the_job_before_its_agent() {
    require_agent_image();
    let w = ws();
    w.config("container", "checks = [\"python3 -m pytest -q\"]", "");
    let id = w.submit(&[], "@@write index.html changed\n@@commit change it");
    let t = Instant::now();
    let o = w.work_once_failing(&id, "failed");
    // (No agent session: the refusal comes at once.)
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("runs `python3`, which the image belay-agent:bookworm does not have")
            && err.contains("belay env build --repo"),
        "{err}"
    );
    assert_eq!(w.remote_log().len(), 1, "nothing was pushed");
}

/// Whether the file at `path` contains `needle` within `limit`.
fn text_within(path: &std::path::Path, needle: &str, limit: Duration) -> bool {
    let t = Instant::now();
    loop {
        if std::fs::read_to_string(path)
            .unwrap_or_default()
            .contains(needle)
        {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `logs` (belay's, the server's), for a failure's message.
fn show_logs(logs: &[std::path::PathBuf]) -> String {
    logs.iter()
        .map(|l| {
            format!(
                "--- {}:\n{}",
                l.display(),
                std::fs::read_to_string(l).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A message belay received inside its batching window, then `kill -9`:
/// the server delivered it once and will not again, so belay keeps its open
/// batches on disk, and the next start makes the job and answers it.
#[test]
fn a_message_inside_the_batching_window_survives_kill_9() {
    require_agent_image();
    let w = ws();
    let server = xmpp::Prosody::start(&w.path("xmpp"), &["builder", "owner"]);
    xmpp_config(&w, server.port, "");
    let cfg = std::fs::read_to_string(w.path("jobs.toml"))
        .unwrap()
        .replace("batch_window_ms = 1500", "batch_window_ms = 8000");
    std::fs::write(w.path("jobs.toml"), cfg).unwrap();
    let mut worker = spawn_xmpp_work(&w);
    let owner = xmpp::Chat::connect("owner", server.port, &w.path("work.log"));
    let logs = [
        w.path("work.log"),
        server.dir.join("prosody.log"),
        server.dir.join("prosody.err"),
    ];
    assert!(
        text_within(
            &w.path("work.log"),
            "online as builder@localhost",
            Duration::from_secs(30)
        ),
        "belay never came online\n{}",
        show_logs(&logs)
    );
    // Killed once belay holds the message in its window (on a loaded
    // machine its delivery can take longer than a fixed wait). A message
    // that never reached belay (once in a full CI run, cause unknown: the
    // logs below say what each side saw) is sent again under a new id:
    // what is tested is what happens to one that did.
    let batches = w.queue().join("xmpp-batches.json");
    let mut held = false;
    let mut sent = 0;
    for id in ["msg-kill", "msg-kill-again"] {
        sent += 1;
        owner.send_with_id("builder@localhost", "@@say kept across the kill", id);
        held = text_within(&batches, "kept across the kill", Duration::from_secs(20));
        if held {
            break;
        }
        eprintln!(
            "message {id} was not batched in 20 s; belay's and the server's logs:\n{}",
            show_logs(&logs)
        );
    }
    assert!(
        held,
        "belay never batched the message\n{}",
        show_logs(&logs)
    );
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert_eq!(
        std::fs::read_dir(w.queue().join("inbox"))
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "the window had not closed: no job yet"
    );
    let worker = spawn_xmpp_work(&w);
    owner.wait_for("kept across the kill", Duration::from_secs(120));
    let err = stop(&w, worker);
    let done = std::fs::read_dir(w.queue().join("done")).unwrap().count();
    // A first message only slow (not lost) can still reach the restarted
    // belay after the resent one made its job: then it is a job of its own.
    assert!(
        (1..=sent).contains(&done),
        "{done} jobs for {sent} messages: {err}"
    );
}
