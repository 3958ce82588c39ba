//! The `belay plan` workspace of the plan and break-in suites: a git
//! repository with a plan file, a scripted agent beside it, belay's state
//! home in the tempdir. The including binary has the modules `common`
//! (shared/pipeline.rs), `git_cli` (shared/git.rs) and `events`
//! (shared/events.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::common::{install_script, require_engine};
use crate::git_cli::{git, init_repo};

/// The start of the scripted agents: the prompt on stdin, the mode in the
/// first argument; it finds its checkpoint in the prompt (`$id`), and
/// `set_field ID FIELD JSON` and `built` edit the plan file with sed. The
/// suite's `case "$mode"` arms follow ([`Setup::agent`]).
pub const AGENT_HEAD: &str = r#"#!/bin/sh
mode=$1
p=$(cat)
id=$(printf '%s\n' "$p" | sed -n "s/.*checkpoint '\([^']*\)'.*/\1/p" | head -n1)
plan=plan_checkpoints.json
set_field() {
  sed -i "/\"id\": \"$1\"/,/\"$2\"/ s/\"$2\": \(.*[^,]\)\(,\{0,1\}\)$/\"$2\": $3\2/" "$plan"
}
built() {
  echo "$id work" > "$id.txt"
  set_field "$id" status '"built"'
  set_field "$id" review_notes '"built it"'
}
case "$mode" in
"#;

/// What differs between the suites' workspaces.
pub struct Setup {
    /// The scripted agent after [`AGENT_HEAD`]: its `case "$mode"` arms and
    /// the rest; run as `cmd:<agent> <mode>`.
    pub agent: &'static str,
    /// The README of the first commit.
    pub readme: &'static str,
    /// The plan file is committed on its own, after the first commit (else
    /// it is in the first commit).
    pub plan_commit: bool,
    /// The plan's branch, whose commits [`Ws::subjects`] lists.
    pub branch: &'static str,
    /// A branch that does not exist has no subjects (else git's failure
    /// fails the test).
    pub no_branch_is_empty: bool,
    /// Variables removed from belay's environment besides the model's.
    pub env_remove: &'static [&'static str],
    /// The flags of [`Ws::run`] before the agents.
    pub run_flags: &'static [&'static str],
}

pub struct Ws {
    pub tmp: tempfile::TempDir,
    pub repo: PathBuf,
    pub agent: PathBuf,
    setup: &'static Setup,
}

/// A plan of two pending checkpoints on `branch` (`c1`, `c2`: each writes
/// its `.txt`), with `project` if given.
pub fn two_checkpoints(branch: &str, project: Option<Value>) -> Value {
    let mut p = json!({
        "plan_file": "docs/plan.md",
        "branch": branch,
        "checkpoints": [
            {"id": "c1", "name": "first", "status": "pending", "scope": "write c1.txt",
             "exit_criteria": ["c1.txt exists"], "attempts": 0, "review_notes": ""},
            {"id": "c2", "name": "second", "status": "pending", "scope": "write c2.txt",
             "exit_criteria": ["c2.txt exists"], "attempts": 0, "review_notes": ""}
        ]
    });
    if let Some(project) = project {
        p["project"] = project;
    }
    p
}

/// The branch's subjects after a run that built and approved both
/// checkpoints of [`two_checkpoints`].
pub const COMPLETED: [&str; 5] = [
    "c1: built",
    "c1: approved",
    "c2: built",
    "c2: approved",
    "audit: completed run",
];

fn write_plan(repo: &Path, plan: &Value) {
    std::fs::write(
        repo.join("plan_checkpoints.json"),
        serde_json::to_string_pretty(plan).unwrap(),
    )
    .unwrap();
}

/// git's stdout in `dir`, or nothing when git fails.
fn git_or_nothing(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    if !o.status.success() {
        return String::new();
    }
    String::from_utf8_lossy(&o.stdout).into_owned()
}

impl Ws {
    /// `repo/` with a README and `plan` as its plan file, the agent beside
    /// it; the engine is required.
    pub fn new(setup: &'static Setup, plan: &Value) -> Ws {
        require_engine();
        Ws::without_engine(setup, plan)
    }

    /// The same workspace for runs with `--on-host` and no gate: no engine.
    pub fn without_engine(setup: &'static Setup, plan: &Value) -> Ws {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(repo.join("README"), setup.readme).unwrap();
        if !setup.plan_commit {
            write_plan(&repo, plan);
        }
        init_repo(&repo);
        if setup.plan_commit {
            write_plan(&repo, plan);
            git(&repo, &["add", "plan_checkpoints.json"]);
            git(&repo, &["commit", "-qm", "the plan"]);
        }
        let agent = tmp.path().join("agent.sh");
        install_script(&agent, &format!("{AGENT_HEAD}{}", setup.agent));
        Ws {
            tmp,
            repo,
            agent,
            setup,
        }
    }

    pub fn spec(&self, mode: &str) -> String {
        format!("cmd:{} {mode}", self.agent.display())
    }

    pub fn state_home(&self) -> PathBuf {
        self.tmp.path().join("state")
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_belay"));
        c.env("BELAY_STATE_HOME", self.state_home())
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .current_dir(&self.repo);
        for name in self.setup.env_remove {
            c.env_remove(name);
        }
        c
    }

    /// `belay plan run` with the setup's flags, `extra` after the agents.
    pub fn run(&self, dev: &str, rev: &str, extra: &[&str]) -> Output {
        self.cmd()
            .args(["plan", "run"])
            .args(self.setup.run_flags)
            .arg("--developer")
            .arg(self.spec(dev))
            .arg("--reviewer")
            .arg(self.spec(rev))
            .args(extra)
            .output()
            .unwrap()
    }

    /// The branch's commit subjects since main, oldest first.
    pub fn subjects(&self) -> Vec<String> {
        let range = format!("main..{}", self.setup.branch);
        let args = ["log", "--reverse", "--format=%s", range.as_str()];
        let out = if self.setup.no_branch_is_empty {
            git_or_nothing(&self.repo, &args)
        } else {
            git(&self.repo, &args)
        };
        out.lines().map(String::from).collect()
    }

    /// The run directories, oldest first.
    pub fn run_dirs(&self) -> Vec<PathBuf> {
        let d = self.state_home().join("plan/runs");
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Every run's events.
    pub fn events(&self) -> Vec<Value> {
        crate::events::read(&self.run_dirs())
    }

    pub fn kinds(&self, kind: &str) -> Vec<Value> {
        crate::events::of_kind(self.events(), kind)
    }
}
